"""RT-DETR's IoU-aware varifocal loss, alone and inside RTDETRHead.

The reference is upstream's ``loss_labels_vfl`` written out: one-hot GT
classes ``y``, score target ``t = y * IoU``, weight
``alpha * sigmoid(p).detach() ** gamma * (1 - y) + t``, BCE with logits,
mean over queries then ``* num_queries / num_boxes``.
"""
import pytest
import torch
import torch.nn.functional as F

from ...test_models.dino_utils import build_model
from .rtdetr_utils import build_tiny, import_project, tiny_rtdetr_cfg

ALPHA, GAMMA = 0.75, 2.0


def reference_vfl(logits, labels, ious, num_boxes):
    """Upstream's formula on (bs, num_queries, num_classes) logits;
    ``labels`` (bs, num_queries) uses num_classes for background."""
    num_classes = logits.size(-1)
    one_hot = F.one_hot(labels, num_classes + 1)[..., :-1].float()
    score = ious[..., None] * one_hot
    weight = ALPHA * logits.sigmoid().detach().pow(GAMMA) * (1 - one_hot) \
        + score
    loss = F.binary_cross_entropy_with_logits(
        logits, score, weight=weight, reduction='none')
    return loss.mean(1).sum() * logits.size(1) / num_boxes


def vfl(**kwargs):
    import_project()
    from mmdet.registry import MODELS
    return MODELS.build(
        dict(type='RTDETRVarifocalLoss', alpha=ALPHA, gamma=GAMMA, **kwargs))


def _inputs(seed=0, bs=2, queries=5, classes=3):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, queries, classes, generator=gen)
    labels = torch.full((bs, queries), classes)
    labels[0, 1], labels[0, 3], labels[1, 0] = 2, 0, 1
    ious = torch.rand(bs, queries, generator=gen) * (labels < classes)
    return logits, labels, ious


def test_loss_equals_upstream_formula_value_and_gradient():
    logits, labels, ious = _inputs()
    classes = logits.size(-1)
    one_hot = F.one_hot(labels, classes + 1)[..., :-1].float()
    ours_in = logits.clone().requires_grad_()
    ours = vfl()(
        ours_in.reshape(-1, classes),
        (one_hot * ious[..., None]).reshape(-1, classes),
        avg_factor=3.0,
        labels=one_hot.reshape(-1, classes))
    ref_in = logits.clone().requires_grad_()
    ref = reference_vfl(ref_in, labels, ious, num_boxes=3.0)
    ours.backward()
    ref.backward()
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)
    torch.testing.assert_close(ours_in.grad, ref_in.grad, rtol=1e-6, atol=1e-9)


def test_matched_class_with_zero_iou_has_zero_weight():
    """Upstream weights a matched class by its IoU (here 0), not as a
    negative; mmdet's varifocal_loss would use alpha * p ** gamma."""
    pred = torch.tensor([[2.0, -1.0]])
    one_hot = torch.tensor([[1.0, 0.0]])
    loss = vfl(reduction='none')(pred, torch.zeros(1, 2), labels=one_hot)
    assert loss[0, 0].item() == 0.0 and loss[0, 1].item() > 0


def test_zero_positives_is_finite_and_bounded():
    pred = torch.randn(6, 3).requires_grad_()
    loss = vfl()(pred, torch.zeros(6, 3), avg_factor=0.0)
    loss.backward()
    unclamped = vfl()(pred, torch.zeros(6, 3), avg_factor=1.0)
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()
    assert loss.item() == unclamped.item()  # divisor clamped to 1


def test_empty_targets_give_a_connected_zero():
    pred = torch.zeros(0, 3, requires_grad=True)
    loss = vfl()(pred, torch.zeros(0, 3), avg_factor=0.0)
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert pred.grad is not None


def test_nan_targets_of_degenerate_boxes_stay_finite():
    pred = torch.randn(3, 2).requires_grad_()
    target = torch.tensor([[float('nan'), 0.], [0., float('inf')], [0., 0.]])
    loss = vfl()(pred, target, avg_factor=1.0)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(pred.grad).all()


def test_wrong_loss_type_in_head_raises():
    model_cfg = tiny_rtdetr_cfg()
    model_cfg.bbox_head.loss_cls = dict(
        type='FocalLoss', use_sigmoid=True, loss_weight=1.0)
    import_project()
    with pytest.raises(TypeError, match='RTDETRVarifocalLoss'):
        build_model(model_cfg)


# --- head level -----------------------------------------------------------


def _head_inputs(gt_boxes, seed=0, queries=6):
    """One 96-px image: logits, boxes (cx, cy, w, h) and GT of class 1."""
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(1, queries, 2, generator=gen).requires_grad_()
    boxes = (torch.rand(1, queries, 4, generator=gen) * 0.5 +
             0.25).requires_grad_()
    gt = InstanceData(
        bboxes=torch.tensor(gt_boxes, dtype=torch.float32).reshape(-1, 4),
        labels=torch.ones(len(gt_boxes), dtype=torch.long))
    meta = dict(img_shape=(96, 96))
    return scores, boxes, [gt], [meta]


@pytest.fixture(scope='module')
def head():
    return build_tiny().bbox_head


def test_head_classification_equals_upstream_formula(head):
    from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_overlaps
    scores, boxes, gts, metas = _head_inputs([[10., 20., 50., 60.],
                                              [40., 40., 90., 80.]])
    loss_cls, _, _ = head.loss_by_feat_single(scores, boxes, gts, metas)
    labels, _, targets, _, num_pos, _ = head.get_targets(
        list(scores), list(boxes), gts, metas)
    assert num_pos == 2
    positive = labels[0] < 2
    ious = torch.zeros(1, scores.size(1))
    ious[0, positive] = bbox_overlaps(
        bbox_cxcywh_to_xyxy(boxes[0, positive]),
        bbox_cxcywh_to_xyxy(targets[0][positive]),
        is_aligned=True).detach()
    expected = reference_vfl(scores, labels[0][None], ious, num_boxes=2)
    torch.testing.assert_close(loss_cls, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize(
    'gt_boxes', [[], [[30., 30., 30., 30.]], [[30., 30., 30., 70.]]],
    ids=['no_gt', 'zero_area', 'zero_width'])
def test_head_losses_finite_without_gt_or_with_degenerate_boxes(
        head, gt_boxes):
    scores, boxes, gts, metas = _head_inputs(gt_boxes)
    losses = head.loss_by_feat_single(scores, boxes, gts, metas)
    total = sum(losses)
    total.backward()
    assert all(torch.isfinite(loss) for loss in losses), losses
    assert torch.isfinite(scores.grad).all()
    assert torch.isfinite(boxes.grad).all()
    if not gt_boxes:
        # all queries are negatives: the divisor is clamped to 1
        expected = reference_vfl(
            scores, torch.full((1, 6), 2), torch.zeros(1, 6), num_boxes=1)
        torch.testing.assert_close(losses[0], expected, rtol=1e-6, atol=0)
