"""SafeVarifocalLoss: finite where mmdet's VarifocalLoss is not."""
import pytest
import torch


def _losses(**kwargs):
    from mmdet.models.losses import VarifocalLoss

    from mmddp_ext.models import SafeVarifocalLoss
    return VarifocalLoss(**kwargs), SafeVarifocalLoss(**kwargs)


def _scores(num=6, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    pred = torch.randn(num, classes, generator=gen).requires_grad_()
    target = torch.zeros(num, classes)
    target[0, 1] = 0.7
    target[3, 0] = 0.4
    return pred, target


def _naive_iou(box_a, box_b):
    """Aligned IoU without an epsilon, as some ports compute it."""
    lt = torch.max(box_a[:, :2], box_b[:, :2])
    rb = torch.min(box_a[:, 2:], box_b[:, 2:])
    inter = (rb - lt).clamp(min=0).prod(dim=1)

    def area(box):
        return (box[:, 2:] - box[:, :2]).prod(dim=1)

    return inter / (area(box_a) + area(box_b) - inter)


# Upstream rejects avg_factor with reduction='sum'.
@pytest.mark.parametrize('reduction, avg_factor',
                         [('mean', None), ('sum', None), ('mean', 2.0),
                          ('mean', torch.tensor(3.))])
def test_ordinary_inputs_match_upstream_bitwise(reduction, avg_factor):
    upstream, safe = _losses(reduction=reduction)
    pred, target = _scores()
    expected = upstream(pred, target, avg_factor=avg_factor)
    got = safe(pred, target, avg_factor=avg_factor)
    assert torch.equal(got, expected)


def test_zero_positives_stays_bounded():
    """A rank without positives: upstream divides by 0 + eps (x 8e6)."""
    upstream, safe = _losses()
    pred, _ = _scores()
    target = torch.zeros_like(pred)
    got = safe(pred, target, avg_factor=0)
    got.backward()
    assert torch.isfinite(got) and torch.isfinite(pred.grad).all()
    expected_sum = upstream(pred, target, reduction_override='sum')
    assert torch.equal(got, expected_sum / (1.0 + torch.finfo().eps))
    assert upstream(pred, target, avg_factor=0) > 1e6 * got


@pytest.mark.parametrize('avg_factor', [None, 0, 4.0])
def test_empty_inputs_give_a_connected_zero(avg_factor):
    upstream, safe = _losses()
    pred = torch.zeros(0, 3, requires_grad=True)
    target = torch.zeros(0, 3)
    got = safe(pred, target, avg_factor=avg_factor)
    assert got.item() == 0.0 and got.requires_grad
    got.backward()
    assert pred.grad.shape == (0, 3)
    if avg_factor is None:  # mean of nothing
        assert torch.isnan(upstream(pred, target))


def test_degenerate_boxes_give_finite_loss_and_gradient():
    """IoU targets of zero-area boxes are 0/0 = NaN when computed without
    an epsilon; upstream propagates the NaN into loss and gradient."""
    upstream, safe = _losses()
    pred = torch.randn(3, 3, generator=torch.Generator().manual_seed(1))
    pred.requires_grad_()
    boxes = torch.tensor([
        [10., 10., 10., 10.],  # zero area
        [5., 5., 5., 20.],  # zero width
        [0., 0., 8., 8.]
    ])
    matched = torch.tensor([[10., 10., 10., 10.], [5., 5., 5., 20.],
                            [2., 2., 8., 8.]])
    iou = _naive_iou(boxes, matched)
    assert torch.isnan(iou[:2]).all()
    target = torch.zeros_like(pred)
    target[torch.arange(3), torch.tensor([0, 1, 2])] = iou

    got = safe(pred, target, avg_factor=3)
    got.backward()
    assert torch.isfinite(got) and torch.isfinite(pred.grad).all()
    assert torch.isnan(upstream(pred, target, avg_factor=3))
    clean = target.nan_to_num(0.0)
    assert torch.equal(got, upstream(pred, clean, avg_factor=3))


@pytest.mark.parametrize('kwargs, match', [
    (dict(use_sigmoid=False), 'use_sigmoid'),
    (dict(reduction='avg'), 'reduction'),
    (dict(min_avg_factor=0), 'min_avg_factor'),
])
def test_invalid_config_raises(kwargs, match):
    from mmddp_ext.models import SafeVarifocalLoss
    with pytest.raises(ValueError, match=match):
        SafeVarifocalLoss(**kwargs)


def test_mismatched_shapes_raise():
    _, safe = _losses()
    with pytest.raises(ValueError, match='same shape'):
        safe(torch.zeros(2, 3), torch.zeros(2, 4))


def test_builds_from_registry():
    from mmdet.registry import MODELS

    import mmddp_ext  # noqa: F401
    loss = MODELS.build(dict(type='SafeVarifocalLoss', min_avg_factor=2.0))
    assert type(loss).__name__ == 'SafeVarifocalLoss'
    assert loss.min_avg_factor == 2.0
