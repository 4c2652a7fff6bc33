"""DEIMv2's checkpoint conversion (what tools/convert_deimv2_checkpoint.py
runs) on checkpoints laid out as upstream's own models
(``data/*_keys.json``, written by upstream's code: see data/README.md):
every size's detector checkpoint, the ViT files the DINOv3 sizes start
from, and B0's ImageNet file for the light sizes.

Models are built on the meta device (shapes only, no arithmetic): the
port's key set and shapes are what these tests compare. Back to upstream's
layout (D-FINE's ``convert_dfine_to_upstream``, ``--to-upstream``):
upstream -> port -> upstream is the identity on every tensor."""
import json
import os.path as osp

import pytest
import torch

from mmddp_ext.utils import (CheckpointConversionError, build_reference_model,
                             compare_state_dicts, upstream_eval_size)
from ...test_utils.test_checkpoint_conversion import emahook_checkpoint
from ..test_dfine.dfine_utils import import_project as import_dfine
from ..test_rtdetr.upstream_layout import with_upstream_anchors
from .deimv2_utils import (DATA, DINOV3_SIZES, REPO_ROOT, SIZES, coco_config,
                           coco_meta_model, import_project)

DFINE_DATA = osp.join(REPO_ROOT, 'tests', 'test_projects', 'test_dfine',
                      'data')
# Values of the buffers the manifests give shapes of only, from upstream's
# YAML (deimv2.yml: reg_scale 4, up 0.5; hgnetv2_x: reg_scale 8).
UPSTREAM_REG_SCALE = {'hgnetv2_x': 8.0}


@pytest.fixture(scope='module')
def deimv2():
    """The DEIMv2 package, whose conversion the CLI runs."""
    return import_project()


def manifest(name: str, folder: str = DATA) -> dict:
    with open(osp.join(folder, name)) as f:
        return json.load(f)


def meta_model(size: str):
    """The size's COCO model on the meta device (built once per process;
    the tests only read it)."""
    return coco_meta_model(size)[1]


def synthetic_checkpoint(size: str, num_points, seed=None) -> dict:
    """Upstream's keys and shapes for ``size``: random weights from
    ``seed`` (zeros without one: the key tests need no values), upstream's
    values for the derived buffers."""
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    scale = torch.tensor([1 / n for n in num_points for _ in range(n)])
    fixed = {
        'up': torch.tensor([0.5]),
        'reg_scale': torch.tensor([UPSTREAM_REG_SCALE.get(size, 4.0)])
    }
    state = {}
    for key, shape in manifest(f'deimv2_{size}_coco_keys.json').items():
        name = key.rsplit('.', 1)[-1]
        if name == 'num_batches_tracked':
            state[key] = torch.tensor(7)
        elif name == 'num_points_scale':
            state[key] = scale.clone()
        elif name in fixed:
            state[key] = fixed[name].clone()
        elif gen is None:
            state[key] = torch.zeros(shape)
        else:
            state[key] = torch.randn(shape, generator=gen)
    return state


def share_like_upstream(state: dict, layers: int) -> None:
    """Atto/Femto/Pico: one box branch saved under every layer index."""
    for key in list(state):
        if key.startswith('decoder.dec_bbox_head.0.'):
            for i in range(1, layers):
                state[key.replace('.0.', f'.{i}.', 1)] = state[key]


@pytest.mark.parametrize('size', SIZES)
def test_every_upstream_key_converts(deimv2, size):
    """Every key of upstream's model of this size is mapped or derived,
    and the result has exactly the port's keys and shapes."""
    model = meta_model(size)
    points = import_dfine().decoder_num_points(model)[0]
    upstream = synthetic_checkpoint(size, points)
    if model.bbox_head.share_bbox_head:
        share_like_upstream(upstream, model.decoder.num_layers)
    log = []
    converted = deimv2.convert_deimv2_state_dict(upstream, model, log.append)
    handled = {
        line.split()[1]
        for line in log if line.startswith(('map', 'skip'))
    }
    assert handled == set(upstream)
    reference = model.state_dict()
    assert set(converted) == set(reference)
    assert {
        k: tuple(v.shape)
        for k, v in converted.items()
    } == {
        k: tuple(v.shape)
        for k, v in reference.items()
    }


def test_atto_loads_values_where_upstream_has_them(deimv2):
    """A real (not meta) Atto: strict load, and values land where the
    mapping says (decoder layer, shared box branch, encoder heads)."""
    model = build_reference_model(coco_config('hgnetv2_atto'))
    upstream = synthetic_checkpoint('hgnetv2_atto', [4, 2], seed=0)
    share_like_upstream(upstream, 3)
    converted = deimv2.convert_deimv2_state_dict(upstream, model,
                                                 lambda line: None)
    model.load_state_dict(converted, strict=True)
    pairs = {
        'decoder.decoder.layers.1.swish_ffn.w12.weight':
        model.decoder.layers[1].swish_ffn.w12.weight,
        'decoder.decoder.layers.2.norm2.scale':
        model.decoder.layers[2].norm2.scale,
        'decoder.dec_bbox_head.0.layers.2.bias':
        model.bbox_head.reg_branches[2].layers[2].bias,
        'decoder.enc_score_head.bias':
        model.bbox_head.cls_branches[3].bias,
        'encoder.bi_fusion.cv.conv.weight':
        model.neck.bi_fusion.cv.conv.weight,
    }
    for key, tensor in pairs.items():
        assert torch.equal(tensor.detach().cpu(), upstream[key]), key


def test_unequal_copies_of_a_shared_branch_are_refused(deimv2):
    """Control: Atto shares the box branch; a checkpoint whose copies
    differ (not an Atto/Femto/Pico file) is refused, naming the key."""
    model = meta_model('hgnetv2_atto')
    upstream = synthetic_checkpoint('hgnetv2_atto', [4, 2], seed=0)
    with pytest.raises(
            CheckpointConversionError, match=r'dec_bbox_head\.1\..* differs'):
        deimv2.convert_deimv2_state_dict(upstream, model, lambda line: None)


def test_a_deim_checkpoint_is_refused_by_a_deimv2_config(deimv2):
    """Control: DEIM / D-FINE-N (LayerNorm, plain FFN, enc_output) is not
    DEIMv2-N: the conversion fails instead of loading it partly."""
    model = meta_model('hgnetv2_n')
    dfine = {
        k: torch.zeros(v)
        for k, v in manifest('dfine_hgnetv2_n_coco_keys.json',
                             DFINE_DATA).items()
        if not k.endswith('num_points_scale')
    }
    with pytest.raises(CheckpointConversionError) as error:
        deimv2.convert_deimv2_state_dict(dfine, model, lambda line: None)
    assert 'swish_ffn' in str(error.value)


@pytest.mark.parametrize('size', DINOV3_SIZES)
def test_vit_files_load_into_the_vit(deimv2, size):
    """The backbone-only ViT file of each DINOv3 size (keys of upstream's
    ``dinov3`` / ``dinov3._model`` module) matches the port's ViT key
    for key, shape for shape."""
    model = meta_model(size)
    vit_file = {
        k: torch.zeros(v)
        for k, v in manifest(f'deimv2_{size}_vit_keys.json').items()
    }
    assert deimv2.is_vit_checkpoint(vit_file)
    converted = deimv2.convert_deimv2_vit_state_dict(
        vit_file, model.backbone.vit.state_dict(), lambda line: None)
    assert set(converted) == set(model.backbone.vit.state_dict())


def test_a_vit_file_of_another_size_is_refused(deimv2):
    """Control: ViT-Tiny's file (S) against ViT-Tiny+ (M) fails."""
    model = meta_model('dinov3_m')
    tiny = {
        k: torch.zeros(v)
        for k, v in manifest('deimv2_dinov3_s_vit_keys.json').items()
    }
    with pytest.raises(CheckpointConversionError, match='vittplus'):
        deimv2.convert_deimv2_vit_state_dict(tiny,
                                             model.backbone.vit.state_dict(),
                                             lambda line: None)


@pytest.mark.parametrize('size,stage2_kept', [('hgnetv2_atto', False),
                                              ('hgnetv2_pico', True)])
def test_b0_imagenet_file_loads_into_the_light_sizes(deimv2, size,
                                                     stage2_kept):
    """B0's ImageNet file (keys of D-FINE-N's backbone manifest) into the
    three-stage sizes, as upstream loads it: every key of matching shape
    kept (stem and stages 0-1 always; stage 2 for Pico, whose stage is
    B0's), stage 3 and Atto's narrower stage 2 dropped."""
    b0 = {
        k[len('backbone.'):]: torch.zeros(v)
        for k, v in manifest('dfine_hgnetv2_n_coco_keys.json',
                             DFINE_DATA).items() if k.startswith('backbone.')
    }
    model = meta_model(size)
    reference = model.backbone.state_dict()
    kept = deimv2.convert_deimv2_hgnetv2_state_dict(b0, reference,
                                                    lambda line: None)
    assert not any(k.startswith('stages.3.') for k in kept)
    assert all(
        k in kept for k in reference
        if k.startswith(('stem.', 'stages.0.', 'stages.1.')))
    stage2 = [k for k in reference if k.startswith('stages.2.')]
    assert all(k in kept for k in stage2) == stage2_kept


# --- back to upstream's layout -------------------------------------------
# upstream's eval_spatial_size and feat_strides (configs/deimv2/*.yml)
ANCHORS = {
    'hgnetv2_atto': dict(eval_size=(320, 320), strides=(16, 32)),
    'dinov3_s': dict(eval_size=(640, 640), strides=(8, 16, 32)),
}


def upstream_checkpoint(size: str, model, seed: int = 0) -> dict:
    """``size`` in upstream's layout: random weights, upstream's derived
    buffers, a shared branch saved under every index as upstream does."""
    state = synthetic_checkpoint(size,
                                 import_dfine().decoder_num_points(model)[0],
                                 seed)
    if model.bbox_head.share_bbox_head:
        share_like_upstream(state, model.decoder.num_layers)
    return with_upstream_anchors(state, **ANCHORS[size])


@pytest.mark.parametrize('size', sorted(ANCHORS))
def test_round_trip_through_the_port_is_the_identity(deimv2, size):
    """Same keys, dtypes and bits, with what the port derives (anchors
    of the size's eval size, valid mask, num_points_scale, up /
    reg_scale's inner copies) and Atto's shared box branch."""
    model = meta_model(size)
    upstream = upstream_checkpoint(size, model)
    quiet = lambda line: None  # noqa: E731
    port = deimv2.convert_deimv2_state_dict(upstream, model, quiet)
    back = import_dfine().convert_dfine_to_upstream(
        port, model, ANCHORS[size]['eval_size'], quiet)
    assert compare_state_dicts(upstream, back) == []


@pytest.mark.parametrize('size', SIZES)
def test_the_inverse_gives_upstreams_keys(size):
    """Every size, keys and shapes only (the meta model's own state dict,
    the anchors of the COCO config's test size): upstream's manifest."""
    cfg, model = coco_meta_model(size)
    back = import_dfine().convert_dfine_to_upstream(
        model.state_dict(), model, upstream_eval_size(cfg),
        lambda line: None)
    layout = {k: list(v.shape) for k, v in back.items()}
    assert layout == manifest(f'deimv2_{size}_coco_keys.json')


def test_command_line_to_upstream(deimv2, tmp_path, monkeypatch):
    """``--to-upstream`` in-process (the command line's main()) for Atto:
    its config's test size (320) gives upstream's anchors; ``model`` and
    ``ema`` equal the upstream weights they came from."""
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import convert_deimv2_checkpoint
    model = meta_model('hgnetv2_atto')
    raw, ema = (upstream_checkpoint('hgnetv2_atto', model, seed)
                for seed in (1, 2))
    quiet = lambda line: None  # noqa: E731
    src, dst = tmp_path / 'ours.pth', tmp_path / 'up.pth'
    torch.save(
        emahook_checkpoint(
            deimv2.convert_deimv2_state_dict(raw, log=quiet),
            deimv2.convert_deimv2_state_dict(ema, log=quiet), 5), src)
    assert convert_deimv2_checkpoint.main([
        '--to-upstream',
        str(src),
        str(dst), '--config',
        coco_config('hgnetv2_atto')
    ]) == 0
    saved = torch.load(dst, weights_only=True)
    assert set(saved) == {'date', 'model', 'ema'}
    assert saved['ema']['updates'] == 5
    assert compare_state_dicts(raw, saved['model']) == []
    assert compare_state_dicts(ema, saved['ema']['module']) == []
