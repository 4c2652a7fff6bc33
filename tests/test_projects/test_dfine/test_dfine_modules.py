"""D-FINE's modules: shapes, freezing, decoder paths, denoising noise,
union matching and config errors."""
import importlib

import pytest
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .dfine_utils import build_tiny, import_project, tiny_model_cfg


@pytest.fixture(scope='module')
def dfine():
    return import_project()


def test_hgnetv2_strides_channels_and_freezing(dfine):
    backbone = dfine.HGNetv2(arch='B0', use_lab=True, out_indices=(1, 2, 3))
    outs = backbone(torch.rand(1, 3, 64, 96))
    assert [tuple(o.shape) for o in outs] == [(1, 256, 8, 12), (1, 512, 4, 6),
                                              (1, 1024, 2, 3)]
    # D-FINE-L/X: stem frozen, every BN frozen (upstream freeze_at 0,
    # freeze_stem_only, freeze_norm)
    frozen = dfine.HGNetv2(arch='B4', frozen_stages=0, freeze_norm=True)
    frozen.train()
    assert not any(p.requires_grad for p in frozen.stem.parameters())
    bns = [m for m in frozen.modules() if isinstance(m, _BatchNorm)]
    assert bns and not any(m.training for m in bns)
    assert not any(p.requires_grad for m in bns for p in m.parameters())
    convs = frozen.stages[0].blocks[0].layers[0].conv
    assert convs.weight.requires_grad
    # channels-last activations in eval only, the same values
    backbone.eval()
    with torch.no_grad():
        image = torch.rand(1, 3, 64, 64)
        fast = backbone(image)
        backbone.channels_last = False
        plain = backbone(image)
    assert fast[0].is_contiguous(memory_format=torch.channels_last)
    assert plain[0].is_contiguous()
    for a, b in zip(fast, plain):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5)
    assert outs[0].is_contiguous()  # training: the default layout
    with pytest.raises(ValueError, match="arch must be one of"):
        dfine.HGNetv2(arch='B9')
    with pytest.raises(ValueError, match='out_indices'):
        dfine.HGNetv2(out_indices=(4, ))


def _batch(model, gt_counts, size=96):
    from ...test_models.dino_utils import raw_batch
    batch = raw_batch(gt_counts)
    return model.data_preprocessor(batch, training=model.training)


def test_decoder_outputs_in_training_and_eval(dfine):
    model = build_tiny()
    data = _batch(model, [2, 1])
    feats = model.extract_feat(data['inputs'])
    outputs = model.forward_transformer(feats, data['data_samples'])
    num_dn = outputs['dn_meta']['num_denoising_queries']
    total = num_dn + model.num_queries
    assert outputs['layers_scores'].shape == (3, 2, total, 2)
    assert outputs['layers_boxes'].shape == (3, 2, total, 4)
    assert outputs['layers_corners'].shape == (3, 2, total, 4 * 33)
    assert outputs['pre_boxes'].shape == outputs['ref_boxes'].shape
    assert not outputs['ref_boxes'].requires_grad
    # per-level points: 2 and 3 on the two levels, 4 heads
    attn = model.decoder.layers[0].cross_attn
    assert attn.num_points_list == [2, 3]
    assert attn.sampling_offsets.out_features == 4 * 5 * 2
    # eval: layers up to eval_idx only, one output layer
    model.eval()
    model.decoder.eval_idx = 1
    calls = []
    for i, layer in enumerate(model.decoder.layers):
        layer.register_forward_hook(lambda *_, i=i: calls.append(i))
    with torch.no_grad():
        outputs = model.forward_transformer(feats, data['data_samples'])
    assert calls == [0, 1]
    assert outputs['layers_scores'].shape == (1, 2, model.num_queries, 2)
    assert set(outputs) == {'layers_scores', 'layers_boxes'}


def test_layer_scale_widens_the_layers_after_eval_idx(dfine):
    """layer_scale 2 with eval_idx 1: layers 0-1 at 64 dims, layer 2 at
    128 (upstream's detachable wide layers); training runs through all."""
    model = build_tiny(decoder=dict(eval_idx=1, layer_scale=2))
    assert model.decoder.layers[2].linear1.in_features == 128
    assert model.decoder.layers[1].linear1.in_features == 64
    assert model.bbox_head.cls_branches[2].in_features == 128
    data = _batch(model, [1, 0])
    losses = model(**data, mode='loss')
    assert all(torch.isfinite(v) for v in losses.values())


def test_dn_boxes_take_the_absolute_size(dfine):
    """D-FINE's noisy dn boxes keep |w|, |h| where RT-DETR's inverse
    sigmoid clips a negative size to 0: the same draws (same seed), the
    same queries wherever no corners crossed."""
    rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
    from ...test_models.dino_utils import raw_batch
    samples = raw_batch([3, 2])['data_samples']
    cfg = dict(
        num_classes=2,
        embed_dims=8,
        num_matching_queries=10,
        label_noise_scale=0.5,
        box_noise_scale=4.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=60))
    ours, theirs = (dfine.DFINECdnQueryGenerator(**cfg),
                    rtdetr.RTDETRCdnQueryGenerator(**cfg))
    torch.manual_seed(0)
    dn_boxes = ours(samples)[1]
    torch.manual_seed(0)
    rt_boxes = theirs(samples)[1]
    clipped = rt_boxes[..., 2:] == rt_boxes[..., 2:].min()
    assert clipped.any()
    sizes = (dn_boxes[..., 2:], rt_boxes[..., 2:])
    assert torch.equal(sizes[0][~clipped], sizes[1][~clipped])
    assert bool((sizes[0][clipped] >= sizes[1][clipped]).all())
    assert (sizes[0][clipped] > sizes[1][clipped]).any()
    assert torch.equal(dn_boxes[..., :2], rt_boxes[..., :2])


def test_union_matching_keeps_each_querys_most_frequent_gt(dfine):
    """Three outputs' matchings of one image: query 0 is matched to GT 0
    twice and GT 1 once, query 1 to GT 1 twice, query 2 to GT 1 once."""
    t = torch.tensor
    matchings = [[(t([0, 1]), t([0, 1]))], [(t([0, 2]), t([1, 1]))],
                 [(t([0, 1]), t([0, 1]))]]
    (query, gt), = dfine.DFINEHead.union_matching(matchings)
    assert dict(zip(query.tolist(), gt.tolist())) == {0: 0, 1: 1, 2: 1}
    empty = dfine.DFINEHead.union_matching([[(t([]).long(), t([]).long())]])
    assert len(empty[0][0]) == 0


def test_config_errors(dfine):
    from mmdet.registry import MODELS
    cfg = tiny_model_cfg()
    cfg.decoder.layer_cfg.num_points = [2, 2, 2]
    with pytest.raises(ValueError, match='one entry per level'):
        MODELS.build(cfg)
    cfg = tiny_model_cfg()
    cfg.bbox_head.reg_max = 16
    with pytest.raises(ValueError, match='sets bbox_head.reg_max'):
        MODELS.build(cfg)
    cfg = tiny_model_cfg()
    cfg.bbox_head.loss_cls = dict(type='VarifocalLoss', use_sigmoid=True)
    with pytest.raises(TypeError, match='takes no labels'):
        MODELS.build(cfg)
    cfg = tiny_model_cfg()
    cfg.decoder.eval_idx = 3
    with pytest.raises(ValueError, match='eval_idx must be in'):
        MODELS.build(cfg)
    cfg = tiny_model_cfg()
    cfg.decoder.reg_max = 31
    with pytest.raises(ValueError, match='even number'):
        MODELS.build(cfg)
