"""RT-DETR building blocks: backbone shortcut, position embedding,
neck/detector config errors and the evaluation path."""
import importlib
import math

import pytest
import torch

from ...test_models.dino_utils import build_model
from .rtdetr_utils import build_tiny, import_project, tiny_rtdetr_cfg


def test_resnet18_vd_has_upstream_first_block_shortcut():
    """PResNet gives stage 1's first block a 1x1 conv + BN shortcut even
    at 64 -> 64 channels; mmdet's ResNetV1d does not."""
    from mmdet.models.backbones import ResNetV1d
    ours = import_project().ResNetVdRTDETR(depth=18, out_indices=(1, 2, 3))
    stock = ResNetV1d(depth=18, out_indices=(1, 2, 3))
    extra = set(ours.state_dict()) - set(stock.state_dict())
    assert extra == {
        f'layer1.0.downsample.{key}'
        for key in ('1.weight', '2.weight', '2.bias', '2.running_mean',
                    '2.running_var', '2.num_batches_tracked')
    }
    x = torch.randn(1, 3, 64, 64)
    assert [tuple(o.shape) for o in ours(x)] == [(1, 128, 8, 8),
                                                 (1, 256, 4, 4),
                                                 (1, 512, 2, 2)]


def test_sincos_position_embedding_is_width_major():
    """Token t of upstream's embedding is (w, h) = divmod(t, height)."""
    layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
    width, height, dims, temperature = 3, 2, 8, 100.
    pos = layers.sincos_pos_embed_2d(width, height, dims, temperature)
    assert pos.shape == (1, width * height, dims)
    omega = 1. / temperature**(torch.arange(2) / 2)
    for token in range(width * height):
        w, h = divmod(token, height)
        expected = torch.cat([(w * omega).sin(), (w * omega).cos(),
                              (h * omega).sin(), (h * omega).cos()])
        torch.testing.assert_close(pos[0, token], expected)


def test_config_errors_name_the_key():
    rtdetr = import_project()
    with pytest.raises(ValueError, match='use_encoder_idx'):
        rtdetr.HybridEncoder(in_channels=[8, 16], use_encoder_idx=[2])
    neck = rtdetr.HybridEncoder(
        in_channels=[8, 16],
        use_encoder_idx=[1],
        hidden_dim=16,
        num_heads=2,
        feedforward_channels=16)
    with pytest.raises(ValueError, match='out_indices'):
        neck([torch.zeros(1, 8, 4, 4)])


def test_predict_runs_and_boxes_are_not_clamped_as_upstream():
    from mmdet.models.dense_heads import DETRHead

    from ...test_models.dino_utils import raw_batch
    model = build_tiny().eval()
    with torch.no_grad():
        data = model.data_preprocessor(raw_batch([1, 0]), False)
        results = model(**data, mode='predict')
    for result in results:
        assert result.pred_instances.bboxes.shape == (30, 4)  # max_per_img
        assert torch.isfinite(result.pred_instances.bboxes).all()
    # a query whose box crosses the left border, x1 = -0.1 of the width
    head = model.bbox_head
    scores = torch.full((30, 2), -9.)
    scores[3, 1] = 9.
    boxes = torch.full((30, 4), 0.5)
    boxes[3] = torch.tensor([0.05, 0.5, 0.3, 0.2])
    meta = dict(img_shape=(50, 100), scale_factor=(2., 2.))
    ours = head._predict_by_feat_single(scores, boxes, meta)
    assert ours.labels[0] == 1
    torch.testing.assert_close(ours.bboxes[0],
                               torch.tensor([-5., 10., 10., 15.]))
    # negative control: mmdet's DETRHead clamps x1 to 0
    stock = DETRHead._predict_by_feat_single(head, scores, boxes, meta)
    assert stock.bboxes[0, 0] == 0


def test_static_tensors_are_built_once_per_size_and_boxes_once_per_layer():
    """Position embeddings and anchors come from the cache after the first
    forward of a size; every regression branch runs once per layer. With
    the cache disabled (the old behaviour) they are rebuilt every time."""
    from unittest import mock

    from ...test_models.dino_utils import raw_batch
    layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
    model = build_tiny()
    reg_calls = []
    for branch in model.bbox_head.reg_branches:
        branch.register_forward_hook(lambda *args: reg_calls.append(1))
    builds = {'pos': 0, 'anchors': 0}
    pos_embed = layers.sincos_pos_embed_2d
    anchors = model.generate_anchors

    def count(name, fn):

        def wrapped(*args, **kwargs):
            builds[name] += 1
            return fn(*args, **kwargs)

        return wrapped

    def step():
        data = model.data_preprocessor(raw_batch([2, 1]), True)
        model(**data, mode='loss')

    with mock.patch.object(
            importlib.import_module('projects.RT-DETR.rtdetr.hybrid_encoder'),
            'sincos_pos_embed_2d', count('pos', pos_embed)), \
            mock.patch.object(model, 'generate_anchors',
                              count('anchors', anchors)):
        step()
        step()
        assert builds == {'pos': 1, 'anchors': 1}
        # one encoder selection + one pass per decoder layer, per step
        assert len(reg_calls) == 2 * (1 + model.decoder.num_layers)
        model.static_cache.enabled = False
        model.neck.pos_embed_cache.enabled = False
        step()
        assert builds == {'pos': 2, 'anchors': 2}


@pytest.mark.parametrize('tree', ['rtdetr_pytorch', 'rtdetrv2_pytorch'])
def test_dn_queries_are_drawn_padded_and_inverted_as_upstream(tree):
    """Label and box noise on, same seed: the port's dn queries equal what
    upstream's ``get_contrastive_denoising_training_group`` returned for
    the same GT (data/upstream_dn_draws.json, made by upstream's code):
    GT padded to the batch maximum (class num_classes, box 0), the noise
    drawn over every query in upstream's order, boxes clamped and
    inverted with eps 1e-5. mmdet's generator draws otherwise."""
    import json
    import os.path as osp

    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    from mmddp_ext.models.layers import DDPSafeCdnQueryGenerator
    with open(
            osp.join(
                osp.dirname(osp.abspath(__file__)), 'data',
                'upstream_dn_draws.json')) as f:
        draws = json.load(f)
    inputs, theirs = draws['inputs'], draws['trees'][tree]
    num_classes = inputs['num_classes']
    ours = import_project().RTDETRCdnQueryGenerator(
        num_classes=num_classes,
        embed_dims=num_classes + 1,
        num_matching_queries=inputs['num_queries'],
        label_noise_scale=inputs['label_noise_ratio'],
        box_noise_scale=inputs['box_noise_scale'],
        group_cfg=dict(
            dynamic=True,
            num_groups=None,
            num_dn_queries=inputs['num_denoising']))
    # identity embedding: each query's label is its argmax, as recorded
    ours.label_embedding.weight.data = torch.eye(num_classes + 1)
    samples = []
    for image in inputs['images']:
        sample = DetDataSample(metainfo=dict(img_shape=image['img_shape']))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor(image['bboxes']),
            labels=torch.tensor(image['labels']))
        samples.append(sample)
    torch.manual_seed(inputs['seed'])
    label_query, box_query, attn_mask, meta = ours(samples)
    assert label_query.argmax(-1).tolist() == theirs['labels']
    torch.testing.assert_close(
        box_query, torch.tensor(theirs['boxes']), rtol=0, atol=1e-5)
    assert attn_mask.int().tolist() == theirs['attn_mask']
    assert meta['num_denoising_groups'] == theirs['dn_num_group']
    assert meta['num_denoising_queries'] == theirs['dn_num_split'][0]
    # the recorded draw has box noise: boxes moved off their GT
    assert box_query[0, 0].sigmoid().tolist() != pytest.approx(
        [0.2, 0.3, 0.2, 0.4], abs=1e-3)
    # negative control: mmdet's generator (the parent) draws otherwise
    torch.manual_seed(inputs['seed'])
    mmdet_query, mmdet_box, _, _ = DDPSafeCdnQueryGenerator.__call__(
        ours, samples)
    assert mmdet_query.argmax(-1).tolist() != theirs['labels']
    assert not torch.allclose(mmdet_box, torch.tensor(theirs['boxes']))


def test_too_small_input_for_the_queries_names_the_fix():
    model = build_tiny().eval()  # 30 queries
    image = torch.zeros(1, 3, 32, 32)  # 4x4 + 2x2 + 1x1 = 21 tokens
    with pytest.raises(ValueError, match='num_queries=30 of the 21'):
        model._forward(image, None)


def test_v2_xavier_init_of_input_projection_and_ffn():
    """xavier_init_proj_ffn (rtdetrv2): xavier-uniform bounds, wider than
    PyTorch's default 1/sqrt(fan_in) for these square-ish layers."""
    import_project()
    bounds = {}
    for flag in (False, True):
        cfg = tiny_rtdetr_cfg()  # building consumes the head config
        cfg.xavier_init_proj_ffn = flag
        model = build_model(cfg)
        layer = model.decoder.layers[0]
        bounds[flag] = [
            model.input_proj[0].conv.weight.abs().max().item(),
            layer.linear1.weight.abs().max().item()
        ]
    fan_in = cfg.decoder.layer_cfg.embed_dims  # 1x1 conv and linear1
    default_bound = 1 / math.sqrt(fan_in)
    assert max(bounds[False]) <= default_bound
    assert min(bounds[True]) > default_bound


def test_attention_calls_skip_the_averaged_weights():
    """need_weights=False in every nn.MultiheadAttention call, as upstream
    (same output, no attention-weight average)."""
    from ...test_models.dino_utils import raw_batch
    model = build_tiny()
    flags = []
    for module in model.modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            module.register_forward_pre_hook(
                lambda m, args, kwargs: flags.append(
                    kwargs.get('need_weights', True)),
                with_kwargs=True)
    data = model.data_preprocessor(raw_batch([1, 1]), True)
    model(**data, mode='loss')
    # 1 AIFI layer + 2 decoder layers
    assert flags == [False] * 3


def test_batch_choice_resize_draws_from_the_list_with_nearest():
    """Upstream's multi-scale step: one size per batch from the list
    (repeats weight it), nearest resizing, boxes and shapes scaled."""
    import random

    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    resize = import_project().BatchChoiceResize(scales=[8, 16, 16, 16])
    image = torch.arange(2 * 3 * 4 * 4, dtype=torch.float).view(2, 3, 4, 4)

    def batch():
        samples = []
        for _ in range(2):
            sample = DetDataSample(
                metainfo=dict(img_shape=(4, 4), pad_shape=(4, 4)))
            sample.gt_instances = InstanceData(
                bboxes=torch.tensor([[0., 1., 2., 3.]]),
                labels=torch.tensor([0]))
            samples.append(sample)
        return image.clone(), samples

    random.seed(0)
    sizes = [resize(*batch())[0].shape[-1] for _ in range(400)]
    assert set(sizes) == {8, 16}
    assert 0.68 < sizes.count(16) / len(sizes) < 0.82  # 3 of 4 entries
    random.seed(1)
    out, samples = resize(*batch())
    size = out.shape[-1]
    torch.testing.assert_close(
        out, torch.nn.functional.interpolate(image, size=(size, size)))
    # nearest: every output pixel is an input pixel (bilinear would blend)
    assert set(out.unique().tolist()) <= set(image.unique().tolist())
    factor = size / 4
    for sample in samples:
        assert sample.img_shape == sample.pad_shape == (size, size)
        assert sample.batch_input_shape == (size, size)
        torch.testing.assert_close(sample.gt_instances.bboxes,
                                   torch.tensor([[0., 1., 2., 3.]]) * factor)
    with pytest.raises(ValueError, match='non-empty list of positive ints'):
        import_project().BatchChoiceResize(scales=(480, 800.5))
    # (height, width) pairs, as F.interpolate's size
    pairs = import_project().BatchChoiceResize(scales=[(8, 12)])
    out, samples = pairs(*batch())
    assert out.shape[-2:] == (8, 12)
    assert samples[0].batch_input_shape == (8, 12)
    torch.testing.assert_close(samples[0].gt_instances.bboxes,
                               torch.tensor([[0., 2., 6., 6.]]))


def test_cross_attention_is_mmcvs_without_reading_the_device(monkeypatch):
    """The decoder's cross-attention computes what mmcv's
    MultiScaleDeformableAttention computes, bit for bit, without mmcv's
    per-call shape assert, a host read of device data (a device sync per
    decoder layer on CUDA). The sampling kernel itself is stood in for
    when counting: its CPU implementation reads the level sizes, the
    CUDA one does not. Control: mmcv's module reads once per call."""
    from mmcv.ops import MultiScaleDeformableAttention
    from mmcv.ops import multi_scale_deform_attn
    from .rtdetr_utils import host_reads
    layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
    dims = dict(
        embed_dims=32, num_heads=4, num_levels=2, num_points=2, dropout=0.0)
    torch.manual_seed(0)
    ours = layers.DeformableCrossAttention(**dims, batch_first=True)
    theirs = MultiScaleDeformableAttention(**dims, batch_first=True)
    theirs.load_state_dict(ours.state_dict())
    inputs = dict(
        query=torch.randn(2, 5, 32),
        value=torch.randn(2, 30, 32),
        query_pos=torch.randn(2, 5, 32),
        reference_points=torch.rand(2, 5, 2, 4),
        spatial_shapes=torch.tensor([[4, 6], [2, 3]]),
        level_start_index=torch.tensor([0, 24]))
    assert torch.equal(ours(**inputs), theirs(**inputs))
    layer = layers.RTDETRDecoderLayer(**dims)
    assert isinstance(layer.cross_attn, layers.DeformableCrossAttention)

    def kernel(value, shapes, locations, weights):
        return value.new_zeros(*locations.shape[:2], value.shape[2:].numel())

    for module in (layers, multi_scale_deform_attn):
        monkeypatch.setattr(module, 'multi_scale_deformable_attn_pytorch',
                            kernel)
    assert host_reads(lambda: ours(**inputs)) == 0
    assert host_reads(lambda: theirs(**inputs)) >= 1
