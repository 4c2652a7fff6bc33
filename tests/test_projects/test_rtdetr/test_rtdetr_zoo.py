"""The official RT-DETR zoo on projects/RT-DETR's configs.

Synthetic upstream checkpoints (random tensors in the layouts of
``upstream_layout``, checked against upstream's modules by
``data/make_upstream_layouts.py`` and here against the pinned r18vd
layouts) are converted with tools/convert_rtdetr_checkpoint.py and loaded
strictly: the ImageNet PResNet backbones through the configs' ``init_cfg``,
and every v1/v2 COCO model into its config. Full-size models are built on
the meta device (shapes only) except where a forward runs.
"""
import copy
import functools
import json
import os.path as osp

import pytest
import torch

from mmddp_ext.utils import CheckpointConversionError
from . import upstream_layout
from .rtdetr_utils import REPO_ROOT, import_project
from .test_convert_rtdetr_checkpoint import DATA

CONFIGS = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs')
rtdetr = import_project()
ZOO_CONFIGS = {
    (1, 'r18vd'): 'rtdetr_r18vd_6x_coco.py',
    (1, 'r34vd'): 'rtdetr_r34vd_6x_coco.py',
    (1, 'r50vd_m'): 'rtdetr_r50vd_m_6x_coco.py',
    (1, 'r50vd'): 'rtdetr_r50vd_6x_coco.py',
    (1, 'r101vd'): 'rtdetr_r101vd_6x_coco.py',
    (2, 'r18vd'): 'rtdetrv2_r18vd_120e_coco.py',
    (2, 'r34vd'): 'rtdetrv2_r34vd_120e_coco.py',
    (2, 'r50vd_m'): 'rtdetrv2_r50vd_m_7x_coco.py',
    (2, 'r50vd'): 'rtdetrv2_r50vd_6x_coco.py',
    (2, 'r101vd'): 'rtdetrv2_r101vd_6x_coco.py',
}


def synthetic_zoo_checkpoint(version: int, name: str, seed: int = 0) -> dict:
    """Random weights of an official COCO model, in upstream's layout."""
    return upstream_layout.synthetic_state_dict(
        upstream_layout.zoo_layout(version, name), seed)


@functools.lru_cache(maxsize=None)
def _parsed_config(config: str):
    """``config`` (a file of ``CONFIGS``) parsed once per process; never
    handed out, see ``zoo_config``."""
    from mmengine.config import Config

    from mmddp_ext.testing import model_index_read_once
    import_project()
    with model_index_read_once():
        return Config.fromfile(osp.join(CONFIGS, config))


def zoo_config(config: str):
    """The parsed ``config`` (a file of ``CONFIGS``): a deep copy of the
    once-parsed one, which a test may change freely."""
    return copy.deepcopy(_parsed_config(config))


def model_cfg(config: str):
    return zoo_config(config).model


def build(cfg, meta: bool = False):
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    if not meta:
        return MODELS.build(cfg)
    with torch.device('meta'):
        return MODELS.build(cfg)


@pytest.mark.parametrize('version', [1, 2])
def test_layout_generator_matches_pinned_upstream_r18vd(version):
    with open(osp.join(DATA, f'rtdetr_r18vd_v{version}_keys.json')) as f:
        pinned = json.load(f)
    assert upstream_layout.zoo_layout(version, 'r18vd') == pinned


@pytest.mark.parametrize('depth,config', [(18, 'rtdetr_r18vd_6x_coco.py'),
                                          (50, 'rtdetr_r50vd_6x_coco.py')])
def test_imagenet_backbone_loads_through_init_cfg_and_freezes_as_upstream(
        depth, config, tmp_path):
    # upstream's r50 file has FrozenBatchNorm2d keys: 275, no counters
    frozen = depth >= 50
    upstream = upstream_layout.synthetic_state_dict(
        upstream_layout.presnet_layout(depth, frozen))
    assert len(upstream) == {18: 138, 50: 275}[depth]
    assert rtdetr.is_presnet_checkpoint(upstream)
    # negative control: the detector mode leaves every key unmapped
    with pytest.raises(CheckpointConversionError) as error:
        rtdetr.convert_rtdetr_state_dict(upstream, log=lambda line: None)
    assert str(error.value).count('unmapped upstream key') == len(upstream)

    cfg = model_cfg(config)
    assert cfg.backbone.init_cfg.type == 'Pretrained'
    path = tmp_path / 'presnet.pth'
    reference = build(cfg.backbone).state_dict()
    torch.save(
        rtdetr.convert_presnet_state_dict(
            upstream, reference, log=lambda line: None), path)
    cfg.backbone.init_cfg.checkpoint = str(path)
    model = build(cfg.backbone)
    model.init_weights()  # runs as part of the detector's init_weights
    backbone = model.state_dict()
    pairs = {
        'conv1.conv1_1.conv.weight':
        'stem.0.weight',
        'conv1.conv1_3.norm.running_var':
        'stem.7.running_var',
        'res_layers.0.blocks.0.short.conv.weight':
        'layer1.0.downsample.1.weight',
        'res_layers.3.blocks.1.branch2b.norm.bias':
        'layer4.1.bn2.bias',
        'res_layers.2.blocks.0.short.conv.conv.weight':
        'layer3.0.downsample.1.weight',
    }
    for theirs, ours in pairs.items():
        assert torch.equal(backbone[ours], upstream[theirs]), ours
    # the file covers the backbone: no missing (or unexpected) keys
    result = model.load_state_dict(
        torch.load(path, weights_only=True), strict=True)
    assert not result.missing_keys and not result.unexpected_keys

    # upstream freeze_at (0 for r50: stem only, -1 for r18) and
    # freeze_norm (r50): the trainable backbone tensors are exactly the
    # upstream ones that keep requires_grad
    model.train()
    trainable = {
        name
        for name, p in model.named_parameters() if p.requires_grad
    }
    expected = {
        rtdetr.convert_presnet_state_dict(
            {
                key: torch.zeros(1)
            }, log=lambda line: None).popitem()[0]
        for key in upstream
        if (not frozen or
            (key.endswith('conv.weight') and not key.startswith('conv1.')))
        and not key.endswith(('running_mean', 'running_var',
                              'num_batches_tracked'))
    }
    assert trainable == expected
    norms_in_train_mode = {
        m.training
        for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)
    }
    assert norms_in_train_mode == {not frozen}


@pytest.mark.parametrize('version,name', sorted(ZOO_CONFIGS))
def test_zoo_checkpoint_converts_and_loads_strictly(version, name):
    upstream = synthetic_zoo_checkpoint(version, name)
    model = build(model_cfg(ZOO_CONFIGS[(version, name)]), meta=True)
    converted = rtdetr.convert_rtdetr_state_dict(
        upstream, model.state_dict(), log=lambda line: None)
    result = model.load_state_dict(converted, strict=True, assign=True)
    assert not result.missing_keys and not result.unexpected_keys
    proj = model.input_proj[0].conv.weight
    assert torch.equal(proj, upstream['decoder.input_proj.0.conv.weight'])


def test_r101vd_decoder_input_projection_follows_feat_channels():
    cfg = model_cfg(ZOO_CONFIGS[(1, 'r101vd')])
    assert cfg.feat_channels == [384] * 3
    upstream = synthetic_zoo_checkpoint(1, 'r101vd')
    # negative control: the 256 -> 256 projection of the other sizes
    cfg.feat_channels = None
    model = build(cfg, meta=True)
    with pytest.raises(CheckpointConversionError) as error:
        rtdetr.convert_rtdetr_state_dict(
            upstream, model.state_dict(), log=lambda line: None)
    assert str(error.value).count('shape mismatch: input_proj.') == 3


def test_m_model_predicts_from_decoder_layer_3():
    """v2-M (eval_idx 2): inference runs decoder layers 0-2 only and the
    predictions are layer 3's; the same weights with eval_idx -1 run all
    6 layers and predict differently."""
    from mmdet.structures import DetDataSample
    cfg = model_cfg(ZOO_CONFIGS[(2, 'r50vd_m')])
    cfg.backbone.init_cfg = None
    model = build(cfg)
    upstream = synthetic_zoo_checkpoint(2, 'r50vd_m', seed=1)
    model.load_state_dict(
        rtdetr.convert_rtdetr_state_dict(
            upstream, model.state_dict(), log=lambda line: None),
        strict=True)
    model.eval()
    calls, logits = [], {}
    for i, layer in enumerate(model.decoder.layers):
        layer.register_forward_hook(lambda *args, i=i: calls.append(i))
    for i, branch in enumerate(model.bbox_head.cls_branches):
        branch.register_forward_hook(
            lambda module, args, out, i=i: logits.__setitem__(i, out))
    size = 160  # 525 tokens >= 300 queries
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(size, size),
            ori_shape=(size, size),
            scale_factor=(1., 1.)))
    image = torch.randint(0, 256, (3, size, size), dtype=torch.uint8)

    def predict():
        calls.clear()
        data = model.data_preprocessor(
            dict(inputs=[image], data_samples=[sample]), False)
        with torch.no_grad():
            return model(**data, mode='predict')[0].pred_instances

    at_layer_3 = predict()
    assert calls == [0, 1, 2]
    top = logits[2][0].sigmoid().flatten().topk(300).values
    torch.testing.assert_close(at_layer_3.scores, top)
    model.decoder.eval_idx = 5
    at_layer_6 = predict()
    assert calls == [0, 1, 2, 3, 4, 5]
    assert not torch.allclose(at_layer_3.scores, at_layer_6.scores)


# (epochs, stop epoch of augmentation and multi-scale or None) from
# upstream's configs/rtdetr*/ *.yml; the lr and weight decay of every
# parameter and the multi-scale sizes: test_rtdetr_upstream_recipes.py
RECIPES = {
    (1, 'r18vd'): (72, None),
    (1, 'r34vd'): (72, None),
    (1, 'r50vd_m'): (72, None),
    (1, 'r50vd'): (72, None),
    (1, 'r101vd'): (72, None),
    (2, 'r18vd'): (120, 117),
    (2, 'r34vd'): (120, 117),
    (2, 'r50vd_m'): (84, 81),
    (2, 'r50vd'): (72, 71),
    (2, 'r101vd'): (72, 71),
}


@pytest.mark.parametrize('version,name', sorted(RECIPES))
def test_zoo_config_recipe_is_upstreams(version, name):
    cfg = zoo_config(ZOO_CONFIGS[(version, name)])
    epochs, stop_epoch = RECIPES[(version, name)]
    assert cfg.train_cfg.max_epochs == epochs
    optim = cfg.optim_wrapper
    assert cfg.sync_bn == 'torch'
    # upstream RandomZoomOut(p=0.5): Expand's own prob, not wrapped again
    zoom = [
        t for t in cfg.train_dataloader.dataset.pipeline if t.type == 'Expand'
        or t.get('transforms', {}).get('type') == 'Expand'
    ]
    assert len(zoom) == 1 and zoom[0].type == 'Expand'
    assert zoom[0].prob == 0.5
    hooks = {hook.type: hook for hook in cfg.custom_hooks}
    assert hooks['EMAHook'].momentum == 1e-4
    eval_idx = cfg.model.decoder.get('eval_idx', -1)
    assert eval_idx == (2 if name == 'r50vd_m' else -1)
    if version == 1:
        assert optim.get('type', 'OptimWrapper') == 'OptimWrapper'
        assert not cfg.param_scheduler  # constant lr, no warm-up
        assert not cfg.model.get('xavier_init_proj_ffn', False)
        assert 'RTDETRAugmentStopHook' not in hooks
    else:
        assert optim.type == 'AmpOptimWrapper'
        warmup, = cfg.param_scheduler
        assert (warmup.type, warmup.end) == ('LinearLR', 2000)
        assert cfg.model.xavier_init_proj_ffn
        stop = hooks['RTDETRAugmentStopHook']
        assert stop.switch_epoch == stop_epoch
        kept = [t.type for t in stop.switch_pipeline]
        assert not {'PhotoMetricDistortion', 'Expand', 'MinIoURandomCrop'
                    } & set(kept)
