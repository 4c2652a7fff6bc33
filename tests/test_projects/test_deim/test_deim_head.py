"""DEIM's criterion: MAL equals upstream's ``loss_labels_mal``; the DEIM
head's loss keys, finiteness and graph on a batch without GT; MAL
normalised by the GT count averaged over real gloo ranks; non-finite
values are not masked.

Expected values: ``mal_example`` of ``data/upstream_recipes.json``
(upstream DEIM's ``DEIMCriterion.loss_labels_mal`` on the inputs recorded
there).
"""
import importlib
import os.path as osp

import pytest
import torch
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_overlaps

from mmddp_ext.testing import run_on_ranks
from ...helpers import REPO_ROOT
from ...test_models.dino_utils import NO_NOISE, loss_values, raw_batch
from ..test_dfine.dfine_utils import EXPECTED_KEYS as DFINE_KEYS
from ..test_dfine.test_dfine_head import DN_SUFFIXES, _losses
from . import upstream_recipes as upstream
from .deim_utils import import_deim

# Every term upstream DEIM computes for a 3-layer decoder: D-FINE's, with
# MAL for VFL and no DDF on the last dn layer.
EXPECTED_KEYS = {
    key.replace('loss_vfl', 'loss_mal')
    for key in DFINE_KEYS if key != 'loss_ddf_dn_2'
}


def _mal_inputs(example):
    inputs = example['inputs']
    logits = torch.tensor(example['logits'])
    boxes = torch.tensor(inputs['pred_boxes'])
    one_hot = torch.zeros_like(logits)
    ious = torch.zeros(logits.shape[:2])
    for image, ((queries, gts), target) in enumerate(
            zip(inputs['indices'], inputs['targets'])):
        gt_boxes = torch.tensor(target['boxes'])[gts]
        for query, gt, gt_box in zip(queries, gts, gt_boxes):
            one_hot[image, query, target['labels'][gt]] = 1
            ious[image, query] = bbox_overlaps(
                bbox_cxcywh_to_xyxy(boxes[image, query][None]),
                bbox_cxcywh_to_xyxy(gt_box[None]))[0, 0]
    return logits.flatten(0, 1), (one_hot * ious[..., None]).flatten(
        0, 1), one_hot.flatten(0, 1), inputs['num_boxes']


def test_mal_equals_upstream():
    import_deim()
    example = upstream.repository(upstream.DEIM)['mal_example']
    logits, targets, one_hot, num_boxes = _mal_inputs(example)
    for case in example['losses']:
        alpha = 1.0 if case['mal_alpha'] is None else case['mal_alpha']
        loss = MODELS.build(
            dict(
                type='MatchabilityAwareLoss', alpha=alpha,
                gamma=case['gamma']))
        got = loss(logits, targets, avg_factor=num_boxes, labels=one_hot)
        assert float(got) == pytest.approx(case['loss_mal'], rel=1e-5), case


def test_varifocal_loss_is_not_mal():
    """Negative control: D-FINE's VFL on the same inputs is another loss."""
    import_deim()
    example = upstream.repository(upstream.DEIM)['mal_example']
    logits, targets, one_hot, num_boxes = _mal_inputs(example)
    vfl = MODELS.build(dict(type='RTDETRVarifocalLoss', gamma=1.5))
    got = float(vfl(logits, targets, avg_factor=num_boxes, labels=one_hot))
    assert got != pytest.approx(example['losses'][0]['loss_mal'], rel=1e-2)


def _tiny_deim(deterministic: bool = False):
    from mmengine.config import Config

    from ...test_models.dino_utils import build_model
    from .deim_utils import PROJECT
    import_deim()
    cfg = Config.fromfile(
        f'{PROJECT}/configs/deim_hgnetv2_tiny_synthetic.py').model
    cfg.data_preprocessor.batch_augments = None
    if deterministic:
        cfg.dn_cfg.label_noise_scale = NO_NOISE
        cfg.dn_cfg.box_noise_scale = NO_NOISE
    model = build_model(cfg)
    if deterministic:
        for module in model.modules():
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
                module.eval()
    return model


def test_batch_without_gt():
    """All-empty batch: upstream DEIM's key set (MAL, no DDF on the last
    dn layer), all finite, dn terms exactly 0 (zero-weight dummy group),
    and every parameter in the graph."""
    model = _tiny_deim()
    losses = _losses(model, [0, 0])
    assert set(losses) == EXPECTED_KEYS
    values = loss_values(losses)
    assert all(abs(v) < float('inf') for v in values.values()), values
    for key, value in values.items():
        if key.endswith(DN_SUFFIXES):
            assert value == 0.0, key
    total, _ = model.parse_losses(losses)
    total.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
    assert set(_losses(model, [2, 0])) == EXPECTED_KEYS


def test_non_finite_predictions_reach_the_loss():
    """No nan_to_num on the losses (upstream has one on every loss): NaN
    boxes give NaN box losses, which mmddp_ext's all-ranks check skips on
    every rank; their NaN IoU targets are cleaned, as in every IoU-aware
    loss (``guarded_score_loss``), so the MAL stays finite."""
    model = _tiny_deim()
    data = model.data_preprocessor(raw_batch([2, 1]), training=True)
    feats = model.extract_feat(data['inputs'])
    outputs = model.forward_transformer(feats, data['data_samples'])
    outputs['layers_boxes'] = outputs['layers_boxes'] * float('nan')
    losses = model.bbox_head.loss(
        **outputs, batch_data_samples=data['data_samples'])
    assert torch.isnan(losses['loss_bbox'])
    assert torch.isfinite(losses['loss_mal'])
    assert torch.isfinite(losses['loss_bbox_enc_0'])


def _ranks_main():
    import torch.distributed as dist
    head_module = importlib.import_module('projects.D-FINE.dfine.dfine_head')
    rank = dist.get_rank()
    counts = [[2, 1], [0, 0]][rank]
    model = _tiny_deim(deterministic=True)
    distributed = loss_values(_losses(model, counts, 2 * rank))
    real_reduce_mean = head_module.reduce_mean
    head_module.reduce_mean = lambda tensor: tensor
    try:
        local = loss_values(_losses(model, counts, 2 * rank))
    finally:
        head_module.reduce_mean = real_reduce_mean
    return dict(distributed=distributed, local=local)


def test_mal_is_normalised_by_the_global_count():
    """Rank 0 has 3 GT boxes, rank 1 none: rank 0's MAL terms are divided
    by the count averaged over ranks (1.5), i.e. twice their
    single-process value; rank 1's are finite (divided by 1.5 too, not by
    its own 0 raised to 1) with the same keys."""
    with_gt, empty = run_on_ranks(_ranks_main, 2, timeout=240)
    assert set(with_gt['distributed']) == set(
        empty['distributed']) == EXPECTED_KEYS
    mal = [k for k in EXPECTED_KEYS if k.startswith('loss_mal')]
    for key in mal:
        assert with_gt['distributed'][key] == pytest.approx(
            2 * with_gt['local'][key], rel=1e-5), key
        value = empty['distributed'][key]
        assert abs(value) < float('inf'), key
        if not key.endswith(DN_SUFFIXES):
            # local divisor 1 (0 raised to 1), global 1.5
            assert value == pytest.approx(
                empty['local'][key] / 1.5, rel=1e-5), key


def _tiny_deim_rtdetr():
    from mmengine.config import Config

    from ...test_models.dino_utils import build_model
    import_deim()
    cfg = Config.fromfile(
        osp.join(REPO_ROOT, 'projects', 'DEIM', 'configs',
                 'deim_rtdetrv2_tiny_synthetic.py'))
    return build_model(cfg.model)


def test_deim_rtdetrv2_batch_without_gt():
    """DEIM on the RT-DETR port (SiLU, 'as_reg' position head, MAL): an
    all-empty batch gives the loss keys of a batch with GT, all finite,
    and every parameter in the graph (the port's DDP-safe denoising)."""
    model = _tiny_deim_rtdetr()
    assert isinstance(model.decoder.layers[0].activation, torch.nn.SiLU)
    assert len(model.query_pos_head.layers) == 3
    assert not any(
        isinstance(m, torch.nn.ReLU) for m in model.bbox_head.modules())
    keys = set(_losses(model, [2, 1]))
    losses = _losses(model, [0, 0])
    assert set(losses) == keys
    values = loss_values(losses)
    assert all(abs(v) < float('inf') for v in values.values()), values
    total, _ = model.parse_losses(losses)
    total.backward()
    assert [n for n, p in model.named_parameters() if p.grad is None] == []
