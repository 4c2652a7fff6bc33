"""The three IoU-aware classification losses share one guarded reduction.

``SafeVarifocalLoss`` (mmdet's varifocal map), RT-DETR's
``RTDETRVarifocalLoss`` and DEIM's ``MatchabilityAwareLoss`` compute
only their element-wise map; ``guarded_score_loss`` cleans non-finite
targets, returns a connected 0 for empty inputs, bounds ``avg_factor``
and computes in float32. Fed the same inputs, they agree wherever the
guard decides, and differ only where their maps do (each test says why).
"""
import importlib

import pytest
import torch
from mmdet.models.losses.utils import weight_reduce_loss
from mmdet.registry import MODELS

from ...test_projects.test_deim.deim_utils import import_deim

ALPHA, GAMMA = 0.75, 2.0
NAMES = ('SafeVarifocalLoss', 'RTDETRVarifocalLoss', 'MatchabilityAwareLoss')
NAN, INF = float('nan'), float('inf')
# Half inputs upcast to float32 run the float32 ops on the same values:
# equal but for the order of a kernel's summation.
AUTOCAST_RTOL = 1e-6
guard_module = importlib.import_module(
    'mmddp_ext.models.losses.safe_varifocal_loss')


def _losses(**kwargs) -> dict:
    import_deim()  # registers RT-DETR's and DEIM's losses
    return {
        name:
        MODELS.build(dict(type=name, alpha=ALPHA, gamma=GAMMA, **kwargs))
        for name in NAMES
    }


def _logits(num=6, classes=3, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num, classes, generator=gen)


def _targets(num=6, classes=3, iou=0.6) -> torch.Tensor:
    target = torch.zeros(num, classes)
    target[0, 1] = iou
    target[3, 0] = iou
    return target


def _run(loss, logits, target, **kwargs):
    """The loss and the gradient of its logits."""
    pred = logits.clone().requires_grad_()
    value = loss(pred, target, **kwargs)
    value.backward()
    return value.detach(), pred.grad


def unguarded(loss_map,
              pred,
              target,
              weight=None,
              reduction='mean',
              avg_factor=None,
              min_avg_factor=1.0,
              divisor_eps=None):
    """mmdet's reduction of the map, as the losses reduced before their
    guards: no cleaning, no bound, no upcast."""
    return weight_reduce_loss(
        loss_map(pred, target), weight, reduction, avg_factor)


@pytest.mark.parametrize('avg_factor', [None, 0.0, 3.0])
def test_empty_inputs_give_the_same_connected_zero(avg_factor):
    for name, loss in _losses().items():
        pred = torch.zeros(0, 3, requires_grad=True)
        value = loss(pred, torch.zeros(0, 3), avg_factor=avg_factor)
        assert value.item() == 0.0 and value.requires_grad, name
        value.backward()
        assert pred.grad.shape == (0, 3), name


def test_non_finite_targets_are_the_cleaned_ones_in_every_loss():
    """NaN and -inf targets (IoU of degenerate or NaN boxes) count as 0,
    +inf as 1: each loss, value and gradient, equals itself on the
    cleaned targets, bit for bit, and is finite."""
    logits = _logits()
    dirty, clean = _targets(), _targets()
    for row, (bad, good) in enumerate([(NAN, 0.), (INF, 1.), (-INF, 0.)]):
        dirty[row + 1, 2], clean[row + 1, 2] = bad, good
    for name, loss in _losses().items():
        value, grad = _run(loss, logits, dirty, avg_factor=2.0)
        expected, expected_grad = _run(loss, logits, clean, avg_factor=2.0)
        assert torch.isfinite(value) and torch.isfinite(grad).all(), name
        assert torch.equal(value, expected), name
        assert torch.equal(grad, expected_grad), name


def test_non_finite_logits_reach_every_loss():
    """Predictions are not cleaned: a NaN logit makes every loss NaN, for
    NonFiniteSkipHook to skip the step on every rank."""
    logits = _logits()
    logits[2, 1] = NAN
    for name, loss in _losses().items():
        assert torch.isnan(loss(logits, _targets(), avg_factor=2.0)), name


def test_zero_positives_give_one_bounded_loss():
    """A rank without GT: all targets 0, so the three maps are the same
    function (alpha * sigmoid(p) ** gamma * BCE(p, 0)) and avg_factor 0
    is raised to 1 in each. The values agree; the gradients differ
    legitimately: mmdet's varifocal_loss back-propagates through the
    modulating factor, upstream RT-DETR and DEIM detach it."""
    logits, target = _logits(), torch.zeros(6, 3)
    results = {
        name: _run(loss, logits, target, avg_factor=0.0)
        for name, loss in _losses().items()
    }
    for name, loss in _losses().items():
        bounded = loss(logits, target, avg_factor=1.0)
        assert torch.equal(results[name][0], bounded), name
    values = [value for value, _ in results.values()]
    for value in values[1:]:
        torch.testing.assert_close(value, values[0], rtol=1e-6, atol=0)
    safe, rtdetr, mal = (grad for _, grad in results.values())
    torch.testing.assert_close(rtdetr, mal, rtol=1e-6, atol=0)
    assert not torch.allclose(safe, rtdetr, rtol=1e-3)


def test_the_ports_divide_by_avg_factor_itself_and_mmdet_adds_eps():
    """What the docstrings say about the divisor: RT-DETR's and DEIM's
    losses divide the summed map by ``avg_factor`` (upstream's box count),
    ``SafeVarifocalLoss`` by mmdet's ``avg_factor + eps``. In float64 the
    two divisors give different values, so each equality can fail."""
    logits = _logits().double()
    target = _targets().double()
    avg_factor = 2.0
    eps = torch.finfo(torch.float32).eps
    for name, loss in _losses().items():
        summed = loss.loss_map(logits, target).sum()
        divisor = avg_factor + eps if name == 'SafeVarifocalLoss' \
            else avg_factor
        value = loss(logits, target, avg_factor=avg_factor)
        assert value.dtype == torch.float64, name
        assert torch.equal(value, summed / divisor), name
        assert not torch.equal(summed / avg_factor, summed /
                               (avg_factor + eps)), name


def test_the_maps_agree_on_binary_targets_and_differ_on_fractional():
    """Targets 0 or 1: weight 1 and target 1 for a match in all three, so
    the values agree. A fractional IoU t: the varifocal losses weight the
    match by t against target t, MAL by 1 against t ** gamma (DEIM's
    change, a low-IoU match keeps a clear target), so MAL differs."""
    logits = _logits()
    binary = [
        loss(logits, _targets(iou=1.0), avg_factor=2.0)
        for loss in _losses().values()
    ]
    for value in binary[1:]:
        torch.testing.assert_close(value, binary[0], rtol=1e-6, atol=0)
    safe, rtdetr, mal = (
        loss(logits, _targets(iou=0.6), avg_factor=2.0)
        for loss in _losses().values())
    torch.testing.assert_close(safe, rtdetr, rtol=1e-6, atol=0)
    assert abs(mal - rtdetr) > 1e-3 * rtdetr


def test_a_match_with_iou_zero_differs_by_design():
    """A matched class whose box has IoU 0: RT-DETR weights it by the
    IoU (0), MAL by 1 against target 0, and SafeVarifocalLoss, which
    takes no labels (mmdet's signature), sees a negative."""
    losses = _losses(reduction='none')
    pred = torch.tensor([[2.0, -1.0]])
    one_hot = torch.tensor([[1.0, 0.0]])
    target = torch.zeros(1, 2)
    rtdetr = losses['RTDETRVarifocalLoss'](pred, target, labels=one_hot)
    mal = losses['MatchabilityAwareLoss'](pred, target, labels=one_hot)
    safe = losses['SafeVarifocalLoss'](pred, target)
    bce = torch.nn.functional.softplus(pred[0, 0])  # BCE(2, target 0)
    assert rtdetr[0, 0].item() == 0.0
    torch.testing.assert_close(mal[0, 0], bce)
    torch.testing.assert_close(safe[0, 0],
                               ALPHA * pred[0, 0].sigmoid()**GAMMA * bce)
    for other in (mal, safe):  # the unmatched class is the same negative
        torch.testing.assert_close(other[0, 1], rtdetr[0, 1])


def test_control_without_the_guard_users_saw_nan(monkeypatch):
    """Negative control: with the shared guard swapped for the unguarded
    reduction, every loss gives NaN on empty inputs ("NaN in the
    varifocal loss on empty targets") and on a NaN target, and the
    zero-positive loss is blown up by 1 / eps."""
    monkeypatch.setattr(guard_module, 'guarded_score_loss', unguarded)
    target = _targets()
    target[1, 2] = NAN
    for name, loss in _losses().items():
        empty = loss(torch.zeros(0, 3, requires_grad=True), torch.zeros(0, 3))
        assert torch.isnan(empty), name
        assert torch.isnan(loss(_logits(), target, avg_factor=2.0)), name
        assert loss(_logits(), torch.zeros(6, 3), avg_factor=0.0) > 1e5, name


def _half_inputs(num=500, classes=80):
    """Float16 logits and targets of a realistic head: a sum of
    num * classes terms that passes float16's 65504."""
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(num, classes, generator=gen) * 2 + 3).half()
    target = torch.zeros(num, classes)
    target[torch.arange(0, num, 4), torch.arange(0, num, 4) % classes] = \
        torch.rand(num // 4, generator=gen)
    return logits, target.half(), torch.ones(num, 1).half()


def _float32_losses(half_inputs) -> dict:
    """Each loss of the same values in float32, outside autocast."""
    logits, target, weight = (t.float() for t in half_inputs)
    return {
        name: loss(logits, target, weight=weight, avg_factor=100.0)
        for name, loss in _losses().items()
    }


def test_autocast_half_inputs_give_the_float32_loss():
    """Under ``torch.autocast('cpu', dtype=torch.float16)`` with float16
    logits, targets and weights, the reduction upcasts itself: the loss
    is float32, finite, and within AUTOCAST_RTOL of the float32 loss of
    the same values."""
    logits, target, weight = half_inputs = _half_inputs()
    expected = _float32_losses(half_inputs)
    for name, loss in _losses().items():
        pred = logits.clone().requires_grad_()
        with torch.autocast('cpu', dtype=torch.float16):
            value = loss(pred, target, weight=weight, avg_factor=100.0)
        value.backward()
        assert value.dtype == torch.float32, name
        assert torch.isfinite(value) and torch.isfinite(pred.grad).all()
        assert pred.grad.dtype == torch.float16, name
        torch.testing.assert_close(
            value, expected[name], rtol=AUTOCAST_RTOL, atol=0)


def test_control_half_inputs_without_the_upcast(monkeypatch):
    """Negative control: reduced in the precision they are computed in,
    the same half inputs miss the float32 loss by more than AUTOCAST_RTOL,
    with autocast (it runs only the cross-entropy in float32) or without.
    Without, RT-DETR's and DEIM's float16 sums pass 65504 (inf); mmdet's
    map casts its masks to float32, so only its precision suffers."""
    logits, target, weight = half_inputs = _half_inputs()
    expected = _float32_losses(half_inputs)
    monkeypatch.setattr(guard_module, 'guarded_score_loss', unguarded)
    for name, loss in _losses().items():
        plain = loss(logits, target, weight=weight, avg_factor=100.0)
        with torch.autocast('cpu', dtype=torch.float16):
            autocast = loss(logits, target, weight=weight, avg_factor=100.0)
        for value in (plain, autocast):
            assert not torch.allclose(
                value.float(), expected[name], rtol=AUTOCAST_RTOL,
                atol=0), (name, value, expected[name])
        if name != 'SafeVarifocalLoss':
            assert torch.isinf(plain), name
