"""D-FINE's checkpoint conversion (what tools/convert_dfine_checkpoint.py
runs; its command line once) on checkpoints laid out as upstream's own
models (``data/*_keys.json``, see data/README.md), and back to upstream's
layout (``convert_dfine_to_upstream``, ``--to-upstream``): upstream ->
port -> upstream is the identity on every tensor, and a broken inverse
fails that check."""
import functools
import json
import os.path as osp
import subprocess
import sys
from importlib import import_module

import pytest
import torch

from mmddp_ext.utils import (CheckpointConversionError, build_reference_model,
                             compare_state_dicts)
from ...test_utils.test_checkpoint_conversion import emahook_checkpoint
from ..test_rtdetr.upstream_layout import with_upstream_anchors
from .dfine_utils import REPO_ROOT, SIZES, import_project, model_config

HERE = osp.dirname(osp.abspath(__file__))
DATA = osp.join(HERE, 'data')
CONVERTER = osp.join(REPO_ROOT, 'tools', 'convert_dfine_checkpoint.py')
# Values of the buffers the manifests only give shapes of, from upstream's
# YAML (configs/dfine/include/dfine_hgnetv2.yml: num_points [3, 6, 3],
# reg_scale 4; dfine_hgnetv2_n_coco.yml: [6, 6]; dfine_hgnetv2_x_coco.yml:
# reg_scale 8) and DFINETransformer (up 0.5).
UPSTREAM_POINTS = {'n': [6, 6]}
UPSTREAM_REG_SCALE = {'x': 8.0}


@pytest.fixture(scope='module')
def dfine():
    """The D-FINE package, whose conversion the CLI runs."""
    return import_project()


def manifest(size: str) -> dict:
    with open(osp.join(DATA, f'dfine_hgnetv2_{size}_coco_keys.json')) as f:
        return json.load(f)


def synthetic_checkpoint(size: str, seed: int = 0) -> dict:
    """A state dict with upstream's keys and shapes for ``size``: random
    weights, upstream's values for the derived buffers."""
    gen = torch.Generator().manual_seed(seed)
    points = UPSTREAM_POINTS.get(size, [3, 6, 3])
    scale = torch.tensor([1 / n for n in points for _ in range(n)])
    fixed = {
        'up': torch.tensor([0.5]),
        'reg_scale': torch.tensor([UPSTREAM_REG_SCALE.get(size, 4.0)])
    }
    state = {}
    for key, shape in manifest(size).items():
        name = key.rsplit('.', 1)[-1]
        if name == 'num_batches_tracked':
            state[key] = torch.tensor(7)
        elif name == 'num_points_scale':
            state[key] = scale.clone()
        elif name in fixed:
            state[key] = fixed[name].clone()
        else:
            state[key] = torch.randn(shape, generator=gen)
    return state


@pytest.mark.parametrize('size', SIZES)
def test_every_upstream_key_converts_and_loads(dfine, size):
    upstream = synthetic_checkpoint(size)
    model = build_reference_model(model_config(size))
    log = []
    converted = dfine.convert_dfine_state_dict(upstream, model.state_dict(),
                                               dfine.decoder_num_points(model),
                                               log.append)
    handled = {line.split()[1] for line in log if line.startswith('map')}
    handled |= {line.split()[1] for line in log if line.startswith('skip')}
    assert handled == set(upstream)
    assert model.load_state_dict(converted, strict=True)
    num_layers = model.decoder.num_layers
    pairs = {
        'decoder.enc_score_head.weight':
        model.bbox_head.cls_branches[num_layers].weight,
        'decoder.enc_bbox_head.layers.2.bias':
        model.bbox_head.reg_branches[num_layers].layers[2].bias,
        'decoder.dec_bbox_head.0.layers.2.weight':
        model.bbox_head.reg_branches[0].layers[2].weight,
        'decoder.pre_bbox_head.layers.0.weight':
        model.bbox_head.pre_bbox_head.layers[0].weight,
        'decoder.denoising_class_embed.weight':
        model.dn_query_generator.label_embedding.weight,
        'decoder.decoder.lqe_layers.1.reg_conf.layers.0.weight':
        model.decoder.lqe_layers[1].reg_conf.layers[0].weight,
        'encoder.encoder.0.layers.0.self_attn.in_proj_weight':
        model.neck.encoder[0].layers[0].self_attn.in_proj_weight,
        'backbone.stages.2.blocks.0.aggregation.1.conv.weight':
        model.backbone.stages[2].blocks[0].aggregation[1].conv.weight,
    }
    for key, param in pairs.items():
        assert torch.equal(upstream[key], param), key
    assert torch.equal(model.decoder.reg_scale, upstream['decoder.reg_scale'])


def test_frozen_backbone_norms_get_num_batches_tracked(dfine):
    """L freezes the backbone's BN (upstream FrozenBatchNorm2d: no
    counter); the converter fills the counter our BN layers have."""
    upstream = synthetic_checkpoint('l')
    key = 'backbone.stem.stem1.bn.num_batches_tracked'
    assert key not in upstream
    converted = dfine.convert_dfine_state_dict(upstream, log=lambda _: None)
    assert converted[key].item() == 0


def _conversion_error(dfine, upstream, reference=None, points=None):
    with pytest.raises(CheckpointConversionError) as error:
        dfine.convert_dfine_state_dict(
            upstream, reference, points, log=lambda _: None)
    return str(error.value)


def test_refuses_what_does_not_fit(dfine):
    model = build_reference_model(model_config('n'))
    upstream = synthetic_checkpoint('n')
    upstream['decoder.extra.weight'] = torch.zeros(1)
    wrong_points = 'decoder.decoder.layers.1.cross_attn.num_points_scale'
    upstream[wrong_points] = torch.tensor([1 / 4] * 4 + [1 / 8] * 8)
    upstream['decoder.decoder.up'] = torch.tensor([0.25])
    message = _conversion_error(dfine, upstream, model.state_dict(),
                                dfine.decoder_num_points(model))
    assert 'unmapped upstream key: decoder.extra.weight' in message
    assert f'{wrong_points}: the checkpoint samples [4, 8] points' in message
    assert 'config [6, 6]' in message
    assert 'decoder.decoder.up ([0.25]) differs from decoder.up' in message


def test_refuses_a_checkpoint_of_another_size(dfine):
    model = build_reference_model(model_config('n'))
    message = _conversion_error(dfine, synthetic_checkpoint('s'),
                                model.state_dict(),
                                dfine.decoder_num_points(model))
    assert 'shape mismatch: neck.input_proj.0.conv.weight' in message
    assert 'converted key not in the model' in message


def test_refuses_deploy_form(dfine):
    """After upstream's deploy() conv + BN pairs are fused
    (``conv_bn_fused``) and RepVGG blocks too: refused with the fix."""
    upstream = synthetic_checkpoint('n')
    upstream['encoder.lateral_convs.0.conv_bn_fused.weight'] = torch.zeros(
        128, 128, 1, 1)
    del upstream['encoder.lateral_convs.0.conv.weight']
    message = _conversion_error(dfine, upstream)
    assert "come from upstream's deploy()" in message
    assert 'saved by training' in message


def test_imagenet_backbone_file(dfine):
    """Upstream's PPHGNetV2_B0_stage1.pth has the backbone's own names: it
    passes as it is, checked against the config's backbone."""
    model = build_reference_model(model_config('s'))
    upstream = {
        k[len('backbone.'):]: v
        for k, v in synthetic_checkpoint('s').items()
        if k.startswith('backbone.')
    }
    assert dfine.is_hgnetv2_checkpoint(upstream)
    converted = dfine.convert_hgnetv2_state_dict(
        upstream, model.backbone.state_dict(), log=lambda _: None)
    assert model.backbone.load_state_dict(converted, strict=True)


def test_command_line(tmp_path):
    """The CLI takes upstream's EMA weights, checks them against the N
    config and writes a file ``load_from`` reads."""
    src, dst = str(tmp_path / 'dfine_n.pth'), str(tmp_path / 'out.pth')
    upstream = synthetic_checkpoint('n')
    torch.save({'ema': {'module': upstream}, 'model': {}}, src)
    result = subprocess.run(
        [sys.executable, CONVERTER, src, dst, '--config',
         model_config('n')],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'from ema.module' in result.stdout
    converted = torch.load(dst, weights_only=True)['state_dict']
    assert torch.equal(converted['bbox_head.cls_branches.3.weight'],
                       upstream['decoder.enc_score_head.weight'])


# --- back to upstream's layout -------------------------------------------
COCO_N = osp.join(REPO_ROOT, 'projects', 'D-FINE', 'configs',
                  'dfine_hgnetv2_n_coco.py')
# upstream's dfine_hgnetv2_n_coco.yml: eval_spatial_size 640, strides 16, 32
N_ANCHORS = dict(eval_size=(640, 640), strides=(16, 32))


@functools.lru_cache(maxsize=None)
def meta_model(size: str, freeze_norm: bool = False):
    """The size's model on the meta device (shapes only), once per
    process; ``freeze_norm`` as upstream's (FrozenBatchNorm2d)."""
    from mmengine.config import Config
    cfg = Config.fromfile(model_config(size))
    if freeze_norm:
        cfg.merge_from_dict({'model.backbone.freeze_norm': True})
    return build_reference_model(cfg, device='meta')


def upstream_n(seed: int = 0, frozen: bool = False) -> dict:
    """N in upstream's layout, with upstream's anchor buffers; ``frozen``:
    no counters in the backbone."""
    state = with_upstream_anchors(synthetic_checkpoint('n', seed),
                                  **N_ANCHORS)
    if frozen:
        state = {
            k: v
            for k, v in state.items() if not (k.startswith('backbone.') and
                                              k.endswith('batches_tracked'))
        }
    return state


def round_trip(dfine, upstream: dict, model) -> dict:
    quiet = lambda line: None  # noqa: E731
    port = dfine.convert_dfine_state_dict(upstream, model.state_dict(),
                                          dfine.decoder_num_points(model),
                                          quiet)
    return dfine.convert_dfine_to_upstream(port, model, (640, 640), quiet)


@pytest.mark.parametrize('frozen', [False, True])
def test_round_trip_through_the_port_is_the_identity(dfine, frozen):
    """Same keys, dtypes and bits, with what the port derives (anchors,
    valid mask, num_points_scale, the inner decoder's up / reg_scale) and
    the counters frozen norms lack."""
    upstream = upstream_n(frozen=frozen)
    back = round_trip(dfine, upstream, meta_model('n', frozen))
    assert compare_state_dicts(upstream, back) == []


def test_the_inverse_gives_upstreams_keys_for_l(dfine):
    """Keys and shapes only (the meta model's own state dict): L's config
    freezes the backbone norms, which lose their counters."""
    model = meta_model('l')
    back = dfine.convert_dfine_to_upstream(model.state_dict(), model,
                                           log=lambda line: None)
    assert {k: list(v.shape) for k, v in back.items()} == manifest('l')


def test_a_broken_inverse_fails_the_round_trip(dfine, monkeypatch):
    """Negative controls: two names swapped show as exactly their keys; a
    dropped table entry is refused, naming the key."""
    conversion = import_module('projects.D-FINE.dfine.'
                               'dfine_checkpoint_conversion')
    names = import_module('projects.D-FINE.dfine.dfine_upstream_param_names')
    upstream, model = upstream_n(), meta_model('n')
    swap = {
        'decoder.enc_score_head.bias': 'decoder.dec_score_head.0.bias',
        'decoder.dec_score_head.0.bias': 'decoder.enc_score_head.bias'
    }
    real = conversion.upstream_name
    with monkeypatch.context() as patch:
        patch.setattr(conversion, 'upstream_name',
                      lambda *args: swap.get(real(*args), real(*args)))
        problems = compare_state_dicts(upstream,
                                       round_trip(dfine, upstream, model))
    assert problems == [f'values: {k}' for k in upstream if k in swap]

    table = names._rules
    with monkeypatch.context() as patch:
        patch.setattr(
            names, '_rules', lambda *args: [
                rule for rule in table(*args)
                if rule[0].pattern != r'decoder\.(up|reg_scale)$'
            ])
        with pytest.raises(CheckpointConversionError,
                           match="No upstream D-FINE name for 'decoder.up'"):
            round_trip(dfine, upstream, model)


def test_command_line_to_upstream(dfine, tmp_path, capsys, monkeypatch):
    """``--to-upstream`` in-process (the command line's main()): the raw
    and EMA weights of an MMEngine checkpoint come back as upstream's
    ``model`` and ``ema``, each equal to the upstream weights it came
    from; the eval size is the COCO config's test size."""
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import convert_dfine_checkpoint
    quiet = lambda line: None  # noqa: E731
    raw, ema = upstream_n(seed=1), upstream_n(seed=2)
    src, dst = tmp_path / 'ours.pth', tmp_path / 'up.pth'
    torch.save(
        emahook_checkpoint(
            dfine.convert_dfine_state_dict(raw, log=quiet),
            dfine.convert_dfine_state_dict(ema, log=quiet), 77), src)
    assert convert_dfine_checkpoint.main(
        ['--to-upstream', str(src),
         str(dst), '--config', COCO_N]) == 0
    saved = torch.load(dst, weights_only=True)
    assert set(saved) == {'date', 'model', 'ema'}
    assert set(saved['ema']) == {'module', 'updates'}
    assert saved['ema']['updates'] == 77
    assert compare_state_dicts(raw, saved['model']) == []
    assert compare_state_dicts(ema, saved['ema']['module']) == []
    assert 'copy  decoder.decoder.up = decoder.up' in capsys.readouterr().out
