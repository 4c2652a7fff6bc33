"""RT-DETR's checkpoint conversion (the package's
``convert_rtdetr_state_dict``) and its command line,
tools/convert_rtdetr_checkpoint.py, on synthetic upstream checkpoints.

``data/rtdetr_r18vd_v{1,2}_keys.json`` pin the key/shape layout of
upstream's r18vd (lyuwenyu/RT-DETR ``rtdetr_pytorch`` and
``rtdetrv2_pytorch``: PResNet-18-vd, HybridEncoder, RTDETRTransformer with
3 decoder layers, 80 classes). v2 differs in the ``conv``/``norm`` names
of the encoder input projections, ``proj``/``norm`` of ``enc_output`` and
three derived buffers (anchors, valid mask, ``num_points_scale``).
"""
import json
import os.path as osp
import subprocess
import sys

import pytest
import torch

from mmddp_ext.utils import CheckpointConversionError
from .rtdetr_utils import R18VD_CONFIG, REPO_ROOT, import_project
from .upstream_layout import synthetic_state_dict

DATA = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
TOOLS = osp.join(REPO_ROOT, 'tools')
CONVERTER = osp.join(TOOLS, 'convert_rtdetr_checkpoint.py')
rtdetr = import_project()


def upstream_state_dict(version: int, seed: int = 0) -> dict:
    """Random tensors with upstream's exact r18vd keys and shapes."""
    with open(osp.join(DATA, f'rtdetr_r18vd_v{version}_keys.json')) as f:
        return synthetic_state_dict(json.load(f), seed)


@pytest.fixture(scope='module')
def r18vd_model():
    import_project()
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    return MODELS.build(Config.fromfile(R18VD_CONFIG).model)


@pytest.mark.parametrize('version', [1, 2])
def test_converted_checkpoint_loads_strictly(version, r18vd_model):
    upstream = upstream_state_dict(version)
    lines = []
    converted = rtdetr.convert_rtdetr_state_dict(
        upstream, r18vd_model.state_dict(), log=lines.append)
    derived = 5 if version == 2 else 0  # anchors, valid_mask, 3 scales
    assert sum(line.startswith('map ') for line in lines) == \
        len(upstream) - derived
    assert sum(line.startswith('skip ') for line in lines) == derived
    result = r18vd_model.load_state_dict(converted, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    state = r18vd_model.state_dict()
    pairs = {
        'backbone.conv1.conv1_1.conv.weight': 'backbone.stem.0.weight',
        'backbone.res_layers.0.blocks.0.short.conv.weight':
        'backbone.layer1.0.downsample.1.weight',
        'backbone.res_layers.2.blocks.0.short.conv.norm.running_var':
        'backbone.layer3.0.downsample.2.running_var',
        'encoder.encoder.0.layers.0.self_attn.in_proj_weight':
        'neck.encoder.0.layers.0.self_attn.in_proj_weight',
        'encoder.fpn_blocks.1.bottlenecks.2.conv2.norm.bias':
        'neck.fpn_blocks.1.bottlenecks.2.conv2.norm.bias',
        'decoder.decoder.layers.2.cross_attn.sampling_offsets.weight':
        'decoder.layers.2.cross_attn.sampling_offsets.weight',
        'decoder.denoising_class_embed.weight':
        'dn_query_generator.label_embedding.weight',
        'decoder.enc_score_head.bias': 'bbox_head.cls_branches.3.bias',
        'decoder.enc_bbox_head.layers.2.weight':
        'bbox_head.reg_branches.3.4.weight',
        'decoder.dec_bbox_head.1.layers.1.bias':
        'bbox_head.reg_branches.1.2.bias',
    }
    for upstream_key, our_key in pairs.items():
        assert torch.equal(state[our_key], upstream[upstream_key]), our_key
    proj = 'proj' if version == 2 else '0'
    assert torch.equal(state['enc_output.0.weight'],
                       upstream[f'decoder.enc_output.{proj}.weight'])


def test_unknown_and_misshaped_keys_fail_loudly(r18vd_model):
    reference = r18vd_model.state_dict()
    upstream = upstream_state_dict(1)
    upstream['decoder.some_new_head.weight'] = torch.zeros(3)
    with pytest.raises(
            CheckpointConversionError,
            match='unmapped upstream key: '
            'decoder.some_new_head.weight'):
        rtdetr.convert_rtdetr_state_dict(
            upstream, reference, log=lambda line: None)

    upstream = upstream_state_dict(1)
    upstream['decoder.enc_score_head.weight'] = torch.zeros(91, 256)
    with pytest.raises(
            CheckpointConversionError,
            match='shape mismatch: '
            r'bbox_head.cls_branches.3.weight .*\(91, 256\)'):
        rtdetr.convert_rtdetr_state_dict(
            upstream, reference, log=lambda line: None)

    # upstream deploy() adds the fused conv next to conv1/conv2: skipped
    upstream = upstream_state_dict(1)
    block = 'encoder.pan_blocks.0.bottlenecks.1'
    upstream[f'{block}.conv.weight'] = torch.zeros(128, 128, 3, 3)
    upstream[f'{block}.conv.bias'] = torch.zeros(128)
    lines = []
    converted = rtdetr.convert_rtdetr_state_dict(
        upstream, reference, log=lines.append)
    assert f'skip  {block}.conv.bias (deploy-form copy of conv1 + conv2)' \
        in lines and len(converted) == len(reference)
    # without the training-form branches there is nothing to convert from
    for key in [k for k in upstream if k.startswith(f'{block}.conv')]:
        if '.conv1.' in key or '.conv2.' in key:
            del upstream[key]
    with pytest.raises(
            CheckpointConversionError, match='only in fused deploy form'):
        rtdetr.convert_rtdetr_state_dict(upstream, log=lambda line: None)

    # v2 per-level num_points: mmcv's attention samples n on every level
    upstream = upstream_state_dict(2)
    scale = 'decoder.decoder.layers.1.cross_attn.num_points_scale'
    upstream[scale] = torch.tensor([1 / 4] * 4 + [1 / 2] * 2 + [1 / 2] * 2)
    with pytest.raises(
            CheckpointConversionError, match='per-level num_points'):
        rtdetr.convert_rtdetr_state_dict(upstream, log=lambda line: None)
    upstream[scale] = torch.full((12, ), 0.25)
    rtdetr.convert_rtdetr_state_dict(upstream, log=lambda line: None)

    upstream = upstream_state_dict(1)
    del upstream['decoder.query_pos_head.layers.1.bias']
    with pytest.raises(
            CheckpointConversionError,
            match='model key missing from the '
            'checkpoint: query_pos_head.layers.1.bias'):
        rtdetr.convert_rtdetr_state_dict(
            upstream, reference, log=lambda line: None)


def test_ema_weights_are_preferred_and_frozen_bn_is_filled():
    model = upstream_state_dict(1, seed=1)
    ema = upstream_state_dict(1, seed=2)
    weights, source = rtdetr.select_upstream_weights({
        'model': model,
        'ema': {
            'module': ema,
            'updates': 5
        }
    })
    assert source == 'ema.module' and weights is ema
    # freeze_norm=True checkpoints (r50vd) have no num_batches_tracked
    frozen = {
        k: v
        for k, v in ema.items() if not k.endswith('num_batches_tracked')
    }
    converted = rtdetr.convert_rtdetr_state_dict(frozen, log=lambda line: None)
    assert converted['backbone.stem.1.num_batches_tracked'].item() == 0
    assert len(converted) == len(ema)


def test_cli_exit_codes(tmp_path, capsys, monkeypatch):
    good = upstream_state_dict(2)
    torch.save({'model': good}, tmp_path / 'good.pth')
    bad = dict(good, **{'decoder.extra.weight': torch.zeros(2)})
    torch.save({'model': bad}, tmp_path / 'bad.pth')

    def run(name):
        return subprocess.run([
            sys.executable, CONVERTER,
            str(tmp_path / name),
            str(tmp_path / f'{name}.out')
        ],
                              capture_output=True,
                              text=True,
                              timeout=60)

    ok = run('good.pth')
    assert ok.returncode == 0, ok.stderr
    assert 'map   decoder.dec_score_head.0.weight -> ' \
        'bbox_head.cls_branches.0.weight (80, 256)' in ok.stdout
    saved = torch.load(tmp_path / 'good.pth.out', weights_only=True)
    assert len(saved['state_dict']) == len(good) - 5
    failed = run('bad.pth')
    assert failed.returncode == 1
    assert 'unmapped upstream key: decoder.extra.weight' in failed.stderr
    assert not osp.exists(tmp_path / 'bad.pth.out')

    # further cases in-process (same main(), no interpreter start-up);
    # tools/ is no package: a plain import, with tools/ on the path
    monkeypatch.syspath_prepend(TOOLS)
    import convert_rtdetr_checkpoint

    def main(*argv):
        return convert_rtdetr_checkpoint.main(list(map(str, argv)))

    torch.save({'model': good}, tmp_path / 'rtdetrv2_r18vd_dsp_3x_coco.pth')
    assert main(tmp_path / 'rtdetrv2_r18vd_dsp_3x_coco.pth',
                tmp_path / 'dsp.out') == 1
    assert 'discrete' in capsys.readouterr().err
    # an ImageNet PResNet file (no detector prefixes) is recognised
    backbone = {
        key[len('backbone.'):]: value
        for key, value in good.items() if key.startswith('backbone.')
    }
    torch.save(backbone, tmp_path / 'presnet18.pth')
    assert main(tmp_path / 'presnet18.pth', tmp_path / 'presnet18.out') == 0
    assert 'ImageNet PResNet backbone' in capsys.readouterr().out
    saved = torch.load(tmp_path / 'presnet18.out', weights_only=True)
    assert 'stem.0.weight' in saved['state_dict']
    # --help is the whole docstring, not its first line cut off
    with pytest.raises(SystemExit):
        main('--help')
    assert "A checkpoint saved after\nupstream's ``deploy()``" in \
        capsys.readouterr().out
