"""Fine-grained distribution refinement (projects/D-FINE/dfine/fdr.py) and
the FGL / DDF losses, against values computed by hand from the paper's
formulas."""
import math

import pytest
import torch

from .dfine_utils import import_project


@pytest.fixture(scope='module')
def fdr():
    import_project()
    import importlib
    return importlib.import_module('projects.D-FINE.dfine.fdr')


def _params(up=0.5, reg_scale=4.0):
    return torch.tensor([up]), torch.tensor([reg_scale])


def test_weighting_function_by_hand(fdr):
    """W(n) for c = up * reg_scale: W(0) = -2c, W(N) = 2c, W(N/2) = 0 and
    W(N/2 +- k) = +-((c + 1) ** (2k / (N - 2)) - 1) in between."""
    up, reg_scale = _params()  # c = 2
    assert fdr.weighting_function(
        4, up, reg_scale).tolist() == [-4.0, -2.0, 0.0, 2.0, 4.0]
    step = 3**(1 / 3)  # (c + 1) ** (2 / (8 - 2))
    expected = [
        -4.0, 1 - step**3, 1 - step**2, 1 - step, 0.0, step - 1, step**2 - 1,
        step**3 - 1, 4.0
    ]
    assert fdr.weighting_function(8, up, reg_scale).tolist() == (
        pytest.approx(expected, abs=1e-6))
    # D-FINE-X: reg_scale 8, c = 4; 33 bins, strictly increasing
    values = fdr.weighting_function(32, *_params(0.5, 8.0))
    assert len(values) == 33 and values[0] == -8 and values[-1] == 8
    assert values[16] == 0 and bool((values.diff() > 0).all())
    assert values[17].item() == pytest.approx(5**(2 / 30) - 1, rel=1e-6)


def test_integral_is_the_expected_bin_value(fdr):
    project = fdr.weighting_function(4, *_params())
    uniform = torch.zeros(1, 2, 4 * 5)
    assert fdr.integral(uniform, project).abs().max() < 1e-6
    peaked = torch.full((1, 1, 4, 5), -1e4)
    for edge, bin_ in enumerate([0, 1, 3, 4]):
        peaked[0, 0, edge, bin_] = 1e4
    offsets = fdr.integral(peaked.flatten(2), project)
    assert offsets.tolist() == [[[-4.0, -2.0, 2.0, 4.0]]]
    # two equal bins: their mean
    half = torch.full((1, 1, 4, 5), -1e4)
    half[..., 2:4] = 0
    assert fdr.integral(half.flatten(2), project)[0, 0].tolist() == (
        pytest.approx([1.0] * 4))


def test_distance2bbox_moves_edges_in_units_of_size(fdr):
    _, reg_scale = _params()
    ref = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    assert torch.allclose(
        fdr.distance2bbox(ref, torch.zeros(1, 4), reg_scale), ref)
    # left edge 1 unit (w / reg_scale = 0.05) further out:
    # x1 = 0.5 - (2 + 1) * 0.05 = 0.35, x2 = 0.6; top edge 1 unit in
    # (0.1 per unit): y1 = 0.5 - (2 - 1) * 0.1 = 0.4, y2 = 0.7
    box = fdr.distance2bbox(ref, torch.tensor([[1.0, -1.0, 0.0, 0.0]]),
                            reg_scale)
    assert box.tolist() == [pytest.approx([0.475, 0.55, 0.25, 0.3])]


def test_bbox2distance_splits_offsets_between_bins(fdr):
    """Bins W = [-4, -2, 0, 2, 4]: offset 1 lies half way between bins 2
    and 3, -3 between 0 and 1, -1.5 a quarter of the way from 1 to 2, 0.5
    a quarter from 2 to 3, 2.5 a quarter from 3 to 4; below W(0) all
    weight goes to bin 0, above W(4) to bin 4 (position clamped to
    4 - 0.1)."""
    up, reg_scale = _params()
    ref = torch.tensor([[0.5, 0.5, 0.2, 0.4]] * 2)
    offsets = torch.tensor([[1.0, -3.0, -1.5, 5.0], [-5.0, 0.5, 2.5, 4.5]])
    gt = fdr.distance2bbox(ref, offsets, reg_scale)
    centre, size = gt[:, :2], gt[:, 2:]
    gt_xyxy = torch.cat([centre - size / 2, centre + size / 2], 1)
    position, right, left = fdr.bbox2distance(ref, gt_xyxy, 4, reg_scale, up)
    assert position.tolist() == pytest.approx(
        [2.0, 0.0, 1.0, 3.9, 0.0, 2.0, 3.0, 3.9], abs=1e-5)
    assert right.tolist() == pytest.approx(
        [0.5, 0.5, 0.25, 1.0, 0.0, 0.25, 0.25, 1.0], abs=1e-5)
    assert (left + right).tolist() == pytest.approx([1.0] * 8)


def test_fgl_loss_by_hand():
    from mmdet.registry import MODELS
    import_project()
    loss = MODELS.build(
        dict(type='FineGrainedLocalizationLoss', loss_weight=0.15))
    # uniform logits over 5 bins: both cross-entropies are log 5
    pred = torch.zeros(2, 5, requires_grad=True)
    value = loss(
        pred,
        torch.tensor([1.5, 3.9]),
        torch.tensor([0.5, 1.0]),
        torch.tensor([0.5, 0.0]),
        weight=torch.tensor([0.8, 0.4]),
        avg_factor=2.0)
    assert value.item() == pytest.approx(0.15 * math.log(5) * 1.2 / 2)
    empty = loss(
        pred[:0],
        torch.zeros(0),
        torch.zeros(0),
        torch.zeros(0),
        avg_factor=torch.tensor(1.0))
    assert empty.item() == 0 and empty.requires_grad


def test_ddf_loss_by_hand():
    """Student and teacher over 2 bins at T = 1: the per-edge KL, weighted;
    matched and unmatched means mixed with their weights."""
    from mmdet.registry import MODELS
    import_project()
    loss = MODELS.build(
        dict(
            type='DecoupledDistillationFocalLoss',
            temperature=1.0,
            loss_weight=1.0))
    pred = torch.zeros(3, 2, requires_grad=True)  # p = (0.5, 0.5)
    teacher = torch.tensor([[math.log(3.0), 0.0]] * 3)  # q = (0.75, 0.25)
    kl = 0.75 * math.log(0.75 / 0.5) + 0.25 * math.log(0.25 / 0.5)
    weight = torch.tensor([1.0, 0.5, 0.0])
    matched = torch.tensor([True, False, False])
    value = loss(pred, teacher, weight, matched, 1.0, 2.0, 3.0, 1.0)
    pos, neg = kl * 1.0 / 1.0, kl * 0.5 / 2.0
    assert value.item() == pytest.approx((pos * 3 + neg * 1) / 4)
    # nothing matched anywhere, empty input: finite, in the graph
    none = loss(pred[:0], teacher[:0], weight[:0], matched[:0], 1.0, 1.0, 0.0,
                1.0)
    assert none.item() == 0 and none.requires_grad
    with pytest.raises(ValueError, match='temperature must be > 0'):
        MODELS.build(
            dict(type='DecoupledDistillationFocalLoss', temperature=0))
