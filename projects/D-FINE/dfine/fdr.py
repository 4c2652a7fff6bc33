"""Fine-grained distribution refinement (FDR): the arithmetic of D-FINE's
box regression, as plain functions on tensors.

A box edge is predicted as a distribution over ``reg_max + 1`` bins. The
bins are the values of the non-uniform weighting function ``W(n)``; the
edge offset is the expectation ``sum_n Pr(n) W(n)`` (the integral), and
offsets move the four edges of a reference box in units of its size
divided by ``reg_scale``. Paper: "D-FINE: Redefine Regression Task of DETRs
as Fine-grained Distribution Refinement", Eq. (2)-(4).
"""
from typing import Tuple

import torch
import torch.nn.functional as F
from mmdet.structures.bbox import bbox_xyxy_to_cxcywh
from torch import Tensor


def weighting_function(reg_max: int, up: Tensor, reg_scale: Tensor) -> Tensor:
    """The bin values ``W(0..reg_max)`` of D-FINE's weighting function.

    With ``c = |up| * |reg_scale|`` and ``step = (c + 1) ** (2 / (reg_max -
    2))``, the values are ``-2c``, then ``1 - step ** k`` for ``k =
    reg_max / 2 - 1, ..., 1``, then 0, then ``step ** k - 1`` for ``k = 1,
    ..., reg_max / 2 - 1``, then ``2c``: symmetric around the middle bin
    (value 0), fine steps near it, coarse ones towards ``+-c``, and the two
    end bins at ``+-2c``.

    Args:
        reg_max (int): Index of the last bin; even, >= 4 (32 upstream).
        up (Tensor): Shape (1,), upstream's ``up`` (0.5).
        reg_scale (Tensor): Shape (1,), upstream's ``reg_scale`` (4, or 8
            for D-FINE-X).

    Returns:
        Tensor: Shape (reg_max + 1,), increasing, in ``up``'s dtype and
        device, differentiable in neither (upstream keeps both fixed).
    """
    bound = up[0].abs() * reg_scale[0].abs()
    step = (bound + 1)**(2 / (reg_max - 2))
    half = reg_max // 2
    powers = torch.arange(1, half, dtype=up.dtype, device=up.device)
    right = step**powers - 1
    left = -right.flip(0)
    return torch.cat([(-2 * bound)[None], left,
                      up.new_zeros(1), right, (2 * bound)[None]])


def integral(corners: Tensor, project: Tensor) -> Tensor:
    """Expected edge offsets ``sum_n softmax(corners)_n * W(n)``.

    Args:
        corners (Tensor): Logits of the four edge distributions, shape
            (..., 4 * (reg_max + 1)).
        project (Tensor): The bin values, :func:`weighting_function`.

    Returns:
        Tensor: Shape (..., 4), the left, top, right, bottom offsets.
    """
    shape = corners.shape[:-1]
    prob = F.softmax(corners.reshape(-1, project.numel()), dim=1)
    return F.linear(prob, project).reshape(*shape, 4)


def distance2bbox(points: Tensor, distance: Tensor,
                  reg_scale: Tensor) -> Tensor:
    """Boxes from a reference box and edge offsets.

    Each edge moves out from the reference centre by ``(reg_scale / 2 +
    offset) * size / reg_scale``, so offset 0 gives back the reference box.

    Args:
        points (Tensor): Reference boxes (cx, cy, w, h), shape (..., 4).
        distance (Tensor): Offsets (left, top, right, bottom), shape
            (..., 4).
        reg_scale (Tensor): Shape (1,).

    Returns:
        Tensor: Boxes (cx, cy, w, h), shape (..., 4); not clamped, so an
        offset below ``-reg_scale / 2`` on both sides gives a negative size
        (as upstream).
    """
    scale = reg_scale.abs()
    unit = points[..., 2:] / scale
    centre = points[..., :2]
    top_left = centre - (0.5 * scale + distance[..., :2]) * unit
    bottom_right = centre + (0.5 * scale + distance[..., 2:]) * unit
    return bbox_xyxy_to_cxcywh(torch.cat([top_left, bottom_right], -1))


def bbox2distance(points: Tensor,
                  bbox: Tensor,
                  reg_max: int,
                  reg_scale: Tensor,
                  up: Tensor,
                  eps: float = 0.1) -> Tuple[Tensor, Tensor, Tensor]:
    """Targets of the fine-grained localization loss: each GT edge offset
    from its reference box, as a position between two bins.

    Inverts :func:`distance2bbox` for the GT box, then locates each offset
    ``d`` in ``W``: ``left`` is the index of the last bin with ``W(left)
    <= d``, and ``d`` is split between bins ``left`` and ``left + 1`` in
    proportion to its distance to each (linear interpolation). Offsets
    below ``W(0)`` put all weight on bin 0, offsets at or above
    ``W(reg_max)`` all on bin ``reg_max``. The returned position is
    clamped to ``[0, reg_max - eps]`` so that ``left + 1`` is a bin.

    Args:
        points (Tensor): Reference boxes (cx, cy, w, h), shape (N, 4).
        bbox (Tensor): GT boxes (x1, y1, x2, y2), shape (N, 4), in the
            same normalised coordinates.
        reg_max (int): Index of the last bin.
        reg_scale (Tensor): Shape (1,).
        up (Tensor): Shape (1,).
        eps (float): Keeps the position below ``reg_max``. Defaults to 0.1.

    Returns:
        tuple[Tensor]: ``position`` (N * 4,) float bin positions (the left
        bin is ``position.long()``), ``weight_right`` and ``weight_left``
        (N * 4,), all detached.
    """
    scale = reg_scale.abs()
    # 1e-16 as upstream: a zero-size reference box gives huge, not inf,
    # offsets
    unit = (points[:, 2:] / scale + 1e-16).repeat(1, 2)
    centre = points[:, :2].repeat(1, 2)
    sign = points.new_tensor([-1.0, -1.0, 1.0, 1.0])
    offsets = (bbox - centre) * sign / unit - 0.5 * scale
    position, weight_right, weight_left = _locate_in_bins(
        offsets.reshape(-1), weighting_function(reg_max, up, reg_scale),
        reg_max)
    position = position.clamp(min=0, max=reg_max - eps)
    return position.detach(), weight_right.detach(), weight_left.detach()


def _locate_in_bins(values: Tensor, bins: Tensor,
                    reg_max: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Left bin index (as float) and interpolation weights of each value;
    see :func:`bbox2distance`."""
    left = (bins[None] <= values[:, None]).sum(1) - 1
    inside = (left >= 0) & (left < reg_max)
    safe_left = left.clamp(0, reg_max - 1)
    left_gap = (values - bins[safe_left]).abs()
    right_gap = (bins[safe_left + 1] - values).abs()
    inside_right = left_gap / (left_gap + right_gap)
    weight_right = torch.where(inside, inside_right,
                               (left >= reg_max).to(values.dtype))
    position = torch.where(left < 0, torch.zeros_like(values),
                           left.to(values.dtype))
    position = torch.where(left >= reg_max,
                           torch.full_like(values, reg_max - 0.1), position)
    return position, weight_right, 1.0 - weight_right
