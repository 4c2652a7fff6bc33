"""RT-DETR building blocks: backbone shortcut, position embedding,
neck/detector config errors and the evaluation path."""
import importlib

import pytest
import torch

from .rtdetr_utils import build_tiny, import_project


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


def test_predict_returns_boxes_inside_the_image():
    from ...test_models.dino_utils import raw_batch
    model = build_tiny().eval()
    with torch.no_grad():
        data = model.data_preprocessor(raw_batch([1, 0]), False)
        results = model(**data, mode='predict')
    for result in results:
        boxes = result.pred_instances.bboxes
        assert boxes.shape == (30, 4)  # test_cfg.max_per_img
        assert torch.isfinite(boxes).all()
        assert boxes.min() >= 0 and boxes.max() <= 96
