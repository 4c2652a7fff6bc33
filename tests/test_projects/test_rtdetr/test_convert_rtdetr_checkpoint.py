"""RT-DETR's checkpoint conversion (the package's
``convert_rtdetr_state_dict``) and its command line,
tools/convert_rtdetr_checkpoint.py, on synthetic upstream checkpoints.

``data/rtdetr_r18vd_v{1,2}_keys.json`` pin the key/shape layout of
upstream's r18vd (lyuwenyu/RT-DETR ``rtdetr_pytorch`` and
``rtdetrv2_pytorch``: PResNet-18-vd, HybridEncoder, RTDETRTransformer with
3 decoder layers, 80 classes). v2 differs in the ``conv``/``norm`` names
of the encoder input projections, ``proj``/``norm`` of ``enc_output`` and
three derived buffers (anchors, valid mask, ``num_points_scale``).

Back to upstream's layout (``convert_rtdetr_to_upstream``, ``--to-upstream``):
upstream -> port -> upstream is the identity on every tensor, and a broken
inverse table fails that check.
"""
import functools
import json
import os.path as osp
import re
import subprocess
import sys
from importlib import import_module

import pytest
import torch

from mmddp_ext.utils import (CheckpointConversionError, build_reference_model,
                             compare_state_dicts)
from ...test_utils.test_checkpoint_conversion import emahook_checkpoint
from .rtdetr_utils import R18VD_CONFIG, REPO_ROOT, import_project
from .upstream_layout import (synthetic_state_dict, with_upstream_anchors,
                              zoo_layout)

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


# --- back to upstream's layout -------------------------------------------
# The COCO configs of each version; v1 and v2 share the port's model.
CONFIGS = {
    (1, 'r18vd'): 'rtdetr_r18vd_6x_coco.py',
    (2, 'r18vd'): 'rtdetrv2_r18vd_120e_coco.py',
    (1, 'r50vd'): 'rtdetr_r50vd_6x_coco.py',
    (2, 'r101vd'): 'rtdetrv2_r101vd_6x_coco.py',
}
FROZEN_NORMS = {
    'model.backbone.norm_cfg.requires_grad': False,
    'model.backbone.norm_eval': True
}


def config_path(version: int, name: str = 'r18vd') -> str:
    return osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                    CONFIGS[version, name])


@functools.lru_cache(maxsize=None)
def meta_model(version: int, name: str = 'r18vd', frozen: bool = False):
    """The config's model on the meta device (shapes only), once per
    process; ``frozen`` freezes the backbone's norms (upstream's
    ``freeze_norm``)."""
    from mmengine.config import Config
    cfg = Config.fromfile(config_path(version, name))
    if frozen:
        cfg.merge_from_dict(FROZEN_NORMS)
    return build_reference_model(cfg, device='meta')


def upstream_checkpoint(version: int, seed: int = 0,
                        frozen: bool = False) -> dict:
    """r18vd in upstream's layout, with upstream's values in v2's anchor
    buffers; ``frozen``: no counters in the backbone (FrozenBatchNorm2d)."""
    state = with_upstream_anchors(
        upstream_state_dict(version, seed), (640, 640), (8, 16, 32))
    if frozen:
        state = {
            k: v
            for k, v in state.items() if not (k.startswith('backbone.') and
                                              k.endswith('batches_tracked'))
        }
    return state


def round_trip(upstream: dict, version: int, model,
               eval_size=(640, 640)) -> dict:
    """upstream -> port (convert_rtdetr_state_dict, checked against the
    model) -> upstream (convert_rtdetr_to_upstream)."""
    quiet = lambda line: None  # noqa: E731
    port = rtdetr.convert_rtdetr_state_dict(upstream, model.state_dict(),
                                            log=quiet)
    return rtdetr.convert_rtdetr_to_upstream(port, model, version,
                                             eval_size, quiet)


@pytest.mark.parametrize('version, frozen', [(1, False), (2, False),
                                             (1, True)])
def test_round_trip_through_the_port_is_the_identity(version, frozen):
    """Same keys, dtypes and bits, the derived buffers (v2's anchors,
    valid mask, num_points_scale) and the frozen BN counters included."""
    upstream = upstream_checkpoint(version, frozen=frozen)
    back = round_trip(upstream, version, meta_model(version, frozen=frozen))
    assert compare_state_dicts(upstream, back) == []


@pytest.mark.parametrize('version, name', [(1, 'r50vd'), (2, 'r101vd')])
def test_the_inverse_gives_upstreams_keys_for_larger_sizes(version, name):
    """Keys and shapes only (the meta model's own state dict): R50's
    frozen backbone norms lose their counters, R101's 384-d encoder maps."""
    model = meta_model(version, name)
    back = rtdetr.convert_rtdetr_to_upstream(model.state_dict(), model,
                                             version, log=lambda line: None)
    assert {k: list(v.shape)
            for k, v in back.items()} == zoo_layout(version, name)


def test_a_broken_inverse_fails_the_round_trip(monkeypatch):
    """Negative controls: the check names exactly the keys a broken table
    or a wrong eval size gets wrong."""
    names = import_module('projects.RT-DETR.rtdetr.'
                          'rtdetr_upstream_param_names')
    upstream = upstream_checkpoint(2)
    model = meta_model(2)
    assert compare_state_dicts(upstream, round_trip(upstream, 2, model)) == []

    # two entries swapped: conv1/bn1 <-> conv2/bn2 of the backbone blocks
    with monkeypatch.context() as patch:
        patch.setitem(names._BRANCH, '1', 'b')
        patch.setitem(names._BRANCH, '2', 'a')
        problems = compare_state_dicts(upstream,
                                       round_trip(upstream, 2, model))
    swapped = {
        k
        for k in upstream if re.search(r'\.branch2[ab]\.', k)
        # both counters hold the same value: a swap cannot show there
        and not k.endswith('num_batches_tracked')
    }
    assert {line.split()[1] for line in problems} == swapped

    # one entry dropped: v2's input projection convs fall through to the
    # generic neck rule and come back under v1's Sequential index
    table = names._rules
    dropped = r'neck\.input_proj\.(\d+)\.0\.(.+)$'
    with monkeypatch.context() as patch:
        patch.setattr(
            names, '_rules', lambda *args:
            [rule for rule in table(*args) if rule[0].pattern != dropped])
        problems = compare_state_dicts(upstream,
                                       round_trip(upstream, 2, model))
    assert problems == (
        [f'missing: encoder.input_proj.{i}.conv.weight' for i in range(3)] +
        [f'extra: encoder.input_proj.{i}.0.weight' for i in range(3)])

    # anchors of another eval size
    problems = compare_state_dicts(
        upstream, round_trip(upstream, 2, model, eval_size=(512, 512)))
    assert problems == [
        'shape: decoder.anchors (1, 8400, 4) -> (1, 5376, 4)',
        'shape: decoder.valid_mask (1, 8400, 1) -> (1, 5376, 1)'
    ]


def test_cli_to_upstream(tmp_path, capsys, monkeypatch):
    """``--to-upstream`` in-process (the same main() as the command line):
    an MMEngine checkpoint with EMA becomes upstream's ``model`` (raw
    weights) and ``ema`` (EMA weights, ``updates``; v1 also ``warmups``),
    each equal to the upstream weights it came from (without EMA: see
    tests/test_utils/test_checkpoint_conversion.py)."""
    monkeypatch.syspath_prepend(TOOLS)
    import convert_rtdetr_checkpoint

    def main(*argv):
        return convert_rtdetr_checkpoint.main(list(map(str, argv)))

    quiet = lambda line: None  # noqa: E731
    for version in (1, 2):
        raw, ema = (upstream_checkpoint(version, seed) for seed in (1, 2))
        torch.save(
            emahook_checkpoint(
                rtdetr.convert_rtdetr_state_dict(raw, log=quiet),
                rtdetr.convert_rtdetr_state_dict(ema, log=quiet), 1234),
            tmp_path / 'ours.pth')
        assert main('--to-upstream', tmp_path / 'ours.pth',
                    tmp_path / 'up.pth', '--config',
                    config_path(version)) == 0
        saved = torch.load(tmp_path / 'up.pth', weights_only=True)
        fields = {'module', 'updates'} | ({'warmups'} if version == 1 else
                                          set())
        assert set(saved) == {'date', 'model', 'ema'}
        assert set(saved['ema']) == fields
        assert saved['ema']['updates'] == 1234
        assert compare_state_dicts(raw, saved['model']) == []
        assert compare_state_dicts(ema, saved['ema']['module']) == []
    assert 'add   decoder.anchors (1, 8400, 4)' in capsys.readouterr().out

    # a config of another model: refused, nothing written
    assert main('--to-upstream', tmp_path / 'ours.pth', tmp_path / 'x.pth',
                '--config', config_path(2, 'r101vd')) == 1
    assert 'shape mismatch' in capsys.readouterr().err
    assert not osp.exists(tmp_path / 'x.pth')
    with pytest.raises(SystemExit):
        main('--to-upstream', tmp_path / 'ours.pth', tmp_path / 'x.pth')
    assert '--to-upstream needs --config' in capsys.readouterr().err
