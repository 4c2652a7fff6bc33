"""D-FINE's loss on batches without GT: same keys, finite, zero-weighted
dummy dn group, the whole graph, normalisers averaged over real gloo
ranks, and no masking of non-finite values."""
import importlib

import pytest
import torch
from mmengine.structures import InstanceData

from mmddp_ext.testing import run_on_ranks
from ...test_models.dino_utils import NO_NOISE, loss_values, raw_batch
from .dfine_utils import EXPECTED_KEYS, build_tiny

DN_SUFFIXES = ('_dn_0', '_dn_1', '_dn_2', '_dn_pre')


def _deterministic_tiny():
    """The tiny model with no dn noise and every BN on running stats, so
    that a batch's loss depends on nothing else."""
    model = build_tiny(
        dn_cfg=dict(label_noise_scale=NO_NOISE, box_noise_scale=NO_NOISE))
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    return model


def _losses(model, gt_counts, first_index=0):
    data = model.data_preprocessor(
        raw_batch(gt_counts, first_index=first_index), training=True)
    return model(**data, mode='loss')


def test_batch_without_gt():
    """All-empty batch: upstream's full key set, all finite, every dn term
    exactly 0 (the dummy group has zero weight), and every parameter,
    the dn class embedding included, in the graph."""
    model = build_tiny()
    losses = _losses(model, [0, 0])
    assert set(losses) == EXPECTED_KEYS
    values = loss_values(losses)
    assert all(abs(v) < float('inf') for v in values.values()), values
    for key, value in values.items():
        if key.endswith(DN_SUFFIXES):
            assert value == 0.0, key
    total, _ = model.parse_losses(losses)
    total.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert missing == []


def test_non_finite_predictions_reach_the_loss():
    """No nan_to_num on the losses (upstream has one on every loss): NaN
    logits give a NaN loss, which mmddp_ext's all-ranks check then skips;
    the matching still runs."""
    model = build_tiny()
    data = model.data_preprocessor(raw_batch([2, 1]), training=True)
    feats = model.extract_feat(data['inputs'])
    outputs = model.forward_transformer(feats, data['data_samples'])
    outputs['layers_scores'] = outputs['layers_scores'] * float('nan')
    losses = model.bbox_head.loss(
        **outputs, batch_data_samples=data['data_samples'])
    assert torch.isnan(losses['loss_vfl'])
    assert torch.isfinite(losses['loss_bbox_enc_0'])


def _ranks_main():
    import torch.distributed as dist
    head_module = importlib.import_module('projects.D-FINE.dfine.dfine_head')
    rank = dist.get_rank()
    counts = [[2, 1], [0, 0]][rank]
    model = _deterministic_tiny()
    distributed = loss_values(_losses(model, counts, 2 * rank))
    real_reduce_mean = head_module.reduce_mean
    head_module.reduce_mean = lambda tensor: tensor
    try:
        local = loss_values(_losses(model, counts, 2 * rank))
    finally:
        head_module.reduce_mean = real_reduce_mean
    return dict(distributed=distributed, local=local)


@pytest.fixture(scope='module')
def two_ranks():
    return run_on_ranks(_ranks_main, 2, timeout=180)


def test_normalisers_are_averaged_over_ranks(two_ranks):
    """Rank 0 has 3 GT boxes, rank 1 none: every count-normalised term of
    rank 0 is divided by half its own count (mmdet's reduce_mean), i.e.
    twice its single-process value, and rank 1's losses are finite with
    the same keys and zero dn terms."""
    with_gt, empty = two_ranks
    assert set(with_gt['distributed']) == set(
        empty['distributed']) == EXPECTED_KEYS
    for key, value in with_gt['distributed'].items():
        if not key.startswith('loss_ddf'):
            assert value == pytest.approx(
                2 * with_gt['local'][key], rel=1e-5), key
    for key, value in empty['distributed'].items():
        assert abs(value) < float('inf'), key
        if key.endswith(DN_SUFFIXES):
            assert value == 0.0, key


def test_box_terms_divide_by_the_box_count_itself():
    """``loss_bbox`` / ``loss_giou`` are the summed terms over the box
    count, as upstream's ``loss_boxes``, exact in float64. Control:
    mmdet's ``avg_factor`` reduction (what the head used) divides by
    ``count + 1.19e-7`` (float32's epsilon), 4e-8 relative apart here."""
    from mmdet.structures.bbox import bbox_overlaps
    head = build_tiny().bbox_head.double()
    gen = torch.Generator().manual_seed(0)
    boxes = torch.rand(1, 5, 4, generator=gen, dtype=torch.float64)
    boxes = torch.cat([0.3 + 0.4 * boxes[..., :2], 0.1 + 0.2 * boxes[..., 2:]],
                      -1)
    gt = boxes[0, :3].flip(0) + 0.01
    num_classes = head.cls_out_channels
    targets = [InstanceData(boxes=gt, labels=torch.tensor([0, 1, 0]))]
    pairs = [(torch.tensor([0, 2, 4]), torch.tensor([0, 1, 2]))]
    count = torch.tensor(3.0, dtype=torch.float64)
    losses = head._output_losses(
        torch.randn(1, 5, num_classes, generator=gen, dtype=torch.float64),
        boxes, None, pairs, count,
        dict(pairs=pairs, num_boxes=count, query_weight=1.0), targets, '')

    def xyxy(b):
        return torch.cat([b[:, :2] - b[:, 2:] / 2, b[:, :2] + b[:, 2:] / 2], 1)

    matched = boxes[0, pairs[0][0]]
    l1_sum = (matched - gt).abs().sum()
    giou_sum = (1 - bbox_overlaps(
        xyxy(matched), xyxy(gt), mode='giou', is_aligned=True)).sum()
    expected = dict(
        loss_bbox=head.loss_bbox.loss_weight * l1_sum / 3,
        loss_giou=head.loss_iou.loss_weight * giou_sum / 3)
    for key, value in expected.items():
        assert losses[key].item() == pytest.approx(
            value.item(), rel=1e-15), key
    mmdet_way = head.loss_bbox(matched, gt, avg_factor=count)
    gap = 1 - mmdet_way.item() / expected['loss_bbox'].item()
    assert gap == pytest.approx(1.1920929e-07 / 3, rel=1e-3)
