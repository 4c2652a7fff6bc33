"""The DEIMv2 model: every shipped config builds; the smallest model
(Atto, with its criterion without FGL / DDF) and the smallest ViT model
(DEIMv2-S) train on a batch with a GT-less image and on a batch without
GT (the same loss keys as with GT, all finite, every parameter in the
graph; the control with upstream's empty-batch denoising drops the dn
embedding from the graph); DINOv3's ViT-S+ puts every parameter in the
graph too."""

import pytest
import torch

from ...test_models.dino_utils import (build_model, loss_values, raw_batch,
                                       swap_behaviour)
from ..test_deim.test_deim_head import EXPECTED_KEYS as DEIM_KEYS
from ..test_dfine.ddp_probe import _UpstreamEmptyDn
from .deimv2_utils import all_configs, coco_config, import_project, model_cfg

# The four-layer decoders (DEIMv2-S, M, L): DEIM's keys for three layers
# plus the fourth layer's auxiliary and denoising terms.
FOUR_LAYER_KEYS = DEIM_KEYS | {
    f'loss_{term}_aux_2'
    for term in ('mal', 'bbox', 'giou', 'fgl', 'ddf')
} | {f'loss_{term}_dn_3'
     for term in ('mal', 'bbox', 'giou', 'fgl')} | {'loss_ddf_dn_2'}
# Atto, Femto, Pico: upstream's losses ['mal', 'boxes'] (no FGL / DDF).
LIGHT_KEYS = {k for k in DEIM_KEYS if 'fgl' not in k and 'ddf' not in k}


def test_every_custom_config_builds():
    """The 12 custom configs and the tiny synthetic one build a DEIMv2 for
    their 2 classes (on the meta device: shapes only). Each inherits a
    COCO config, which test_convert_deimv2_checkpoint builds and compares
    with upstream's model key for key."""
    from mmdet.registry import MODELS
    configs = all_configs()
    assert len([c for c in configs if c.endswith('_coco.py')]) == 12
    custom = [c for c in configs if not c.endswith('_coco.py')]
    assert len(custom) == 13
    for config in custom:
        cfg = model_cfg(config)
        with torch.device('meta'):
            model = MODELS.build(cfg)
        assert type(model).__name__ == 'DEIMv2', config
        assert model.bbox_head.num_classes == 2, config


def _train_step(model, gt_counts):
    model.zero_grad(set_to_none=True)
    data = model.data_preprocessor(raw_batch(gt_counts), training=True)
    losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    total.backward()
    return losses


def _without_grad(model):
    return [
        name for name, p in model.named_parameters()
        if p.requires_grad and p.grad is None
    ]


def _check_gt_less_batch(model, expected_keys):
    """A batch whose second image has no box, and a batch without any box
    (a GT-less rank): upstream's full key set (that of a batch with GT),
    every value finite, every trainable parameter with a gradient."""
    for gt_counts in ([3, 0], [0, 0]):
        losses = _train_step(model, gt_counts)
        assert set(losses) == expected_keys, gt_counts
        values = loss_values(losses)
        assert all(abs(v) < float('inf') for v in values.values()), values
        assert _without_grad(model) == [], gt_counts
    assert set(_train_step(model, [2, 1])) == expected_keys


def test_atto_trains_on_a_batch_with_a_gt_less_image():
    cfg = model_cfg(
        coco_config('hgnetv2_atto'),
        num_queries=30,
        **{
            'backbone.init_cfg': None,
            'bbox_head.num_classes': 2,
            'data_preprocessor.batch_augments': None,
            'test_cfg.max_per_img': 30
        })
    model = build_model(cfg)
    assert model.bbox_head.reg_branches[2] is model.bbox_head.reg_branches[0]
    # Atto's criterion: no FGL / DDF, each output's own matching; every
    # parameter still gets a gradient on every kind of batch (what DDP
    # with find_unused_parameters=False needs on a GT-less rank)
    assert model.bbox_head.losses == ('mal', 'boxes')
    assert not model.bbox_head.use_uni_set
    _check_gt_less_batch(model, LIGHT_KEYS)
    # Control: upstream's denoising on a batch without GT (no dn queries):
    # the dn class embedding leaves the graph, the parameter DDP's
    # reducer would wait for on that rank.
    swap_behaviour(model.dn_query_generator, _UpstreamEmptyDn)
    _train_step(model, [0, 0])
    assert _without_grad(model) == [
        'dn_query_generator.label_embedding.weight'
    ]


def test_dinov3_s_trains_on_a_batch_with_a_gt_less_image():
    cfg = model_cfg(
        coco_config('dinov3_s'),
        num_queries=30,
        **{
            'bbox_head.num_classes': 2,
            'data_preprocessor.batch_augments': None,
            'backbone.vit_init_cfg': None,
            'test_cfg.max_per_img': 30
        })
    _check_gt_less_batch(build_model(cfg), FOUR_LAYER_KEYS)


def test_dinov3_vit_s_plus_puts_every_parameter_in_the_graph():
    """DEIMv2-X's backbone (ViT-S+ with SwiGLU, storage tokens,
    LayerScale, the masked key bias, DINOv3's mask token): three maps at
    strides 8 / 16 / 32, and a gradient for every parameter, the mask
    token's included (upstream adds it times 0)."""
    from mmdet.registry import MODELS

    from mmddp_ext.testing import on_rank_device
    import_project()
    backbone = on_rank_device(
        MODELS.build(
            dict(
                type='DINOv3STAs',
                name='dinov3_vits16plus',
                interaction_indexes=[5, 8, 11],
                conv_inplane=8,
                hidden_dim=32)))
    device = backbone.dinov3.cls_token.device
    outs = backbone(torch.rand(2, 3, 64, 96, device=device))
    assert [tuple(o.shape) for o in outs] == [(2, 32, 8, 12), (2, 32, 4, 6),
                                              (2, 32, 2, 3)]
    sum(o.sum() for o in outs).backward()
    assert [n for n, p in backbone.named_parameters() if p.grad is None] == []
    mask = backbone.dinov3.blocks[0].attn.qkv.bias_mask.cpu()
    assert mask[384:768].sum() == 0 and mask[:384].eq(1).all()


def test_sta_refuses_sizes_off_the_token_grid():
    from mmdet.registry import MODELS
    import_project()
    backbone = MODELS.build(
        dict(
            type='DINOv3STAs', name='vit_tiny', interaction_indexes=[3, 7,
                                                                     11]))
    with pytest.raises(ValueError, match='pad_size_divisor'):
        backbone(torch.rand(1, 3, 40, 48))


def test_unknown_vit_name_is_a_value_error():
    from mmdet.registry import MODELS
    import_project()
    with pytest.raises(ValueError, match='vit_tinyplus'):
        MODELS.build(
            dict(
                type='DINOv3STAs',
                name='vit_base',
                interaction_indexes=[3, 7, 11]))
