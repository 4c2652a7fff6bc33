"""The one guarded reduction of the IoU-aware classification losses.

The varifocal losses (mmdet's, RT-DETR's) and DEIM's matchability-aware
loss differ only in their element-wise loss map; the edge cases of DETR
training (a rank with no GT, IoU targets of degenerate boxes, mixed
precision) are handled here, once, for all of them.
"""
from typing import Callable, Optional, Union

import torch
from mmdet.models.losses.utils import weight_reduce_loss
from torch import Tensor

LossMap = Callable[[Tensor, Tensor], Tensor]


def clean_score_targets(target: Tensor) -> Tensor:
    """IoU-aware score targets with NaN and -inf replaced by 0 and +inf by
    1.

    The IoU of a zero-area box computed without an epsilon is 0/0; a box
    that overlaps nothing has IoU 0, and +inf can only be a perfect match.
    Unconditional: finite targets pass unchanged, and testing for
    non-finite ones first would cost a device sync per call.
    """
    return torch.nan_to_num(target, nan=0.0, posinf=1.0, neginf=0.0)


def guarded_score_loss(loss_map: LossMap,
                       pred: Tensor,
                       target: Tensor,
                       weight: Optional[Tensor] = None,
                       reduction: str = 'mean',
                       avg_factor: Optional[Union[float, Tensor]] = None,
                       min_avg_factor: float = 1.0,
                       divisor_eps: Optional[float] = None) -> Tensor:
    """``loss_map(pred, target)`` reduced as mmdet's ``weight_reduce_loss``
    (weights, then 'none', 'mean' or 'sum'; 'mean' with ``avg_factor`` is
    ``sum / (avg_factor + eps)``), finite where that one is not:

    - Empty ``pred`` (no queries): a reducing call returns the sum of the
      empty map, an exact 0 in the graph (DDP still sees the classifier
      used), not the mean of nothing (NaN).
    - ``avg_factor`` is raised to ``min_avg_factor``: with zero positives
      on a rank, dividing by ``0 + eps`` multiplies the negatives' loss by
      about 8e6.
    - Non-finite targets are cleaned (:func:`clean_score_targets`) before
      the map sees them. ``pred`` is not: a non-finite logit gives a
      non-finite loss, for ``NonFiniteSkipHook`` to see and skip on every
      rank.

    On finite inputs with ``avg_factor`` at or above ``min_avg_factor``
    the result is that of ``weight_reduce_loss`` bit for bit (with
    ``divisor_eps=None``), or the weighted sum divided by ``avg_factor``
    itself (``divisor_eps=0``, as upstream RT-DETR, D-FINE and DEIM divide
    by their box count).

    Args:
        loss_map (Callable): Element-wise loss of ``(pred, target)``, both
            at least float32, returning a tensor of their shape.
        pred (Tensor): Logits, shape (N, C).
        target (Tensor): Score targets, shape (N, C).
        weight (Tensor, optional): Weights broadcastable to (N, C).
            Defaults to None.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        avg_factor (float | Tensor, optional): Divisor of the summed loss
            for reduction 'mean'. Defaults to None (the element mean).
        min_avg_factor (float): Lower bound of ``avg_factor``. Defaults to
            1.0.
        divisor_eps (float, optional): Added to ``avg_factor``; None:
            mmdet's (float32's machine epsilon). Defaults to None.

    Returns:
        Tensor: The loss, at least float32; element-wise for 'none'.
    """
    if avg_factor is not None and reduction == 'sum':
        raise ValueError(
            'avg_factor divides the loss of reduction="mean" only, but got '
            f'reduction="sum" with avg_factor={avg_factor}. Pass '
            'avg_factor=None or reduction_override="mean".')
    # Upcast to float32 here, not in the callers: under autocast or with
    # float16 inputs the map's sigmoid powers lose precision or underflow
    # and a sum over queries x classes passes float16's 65504 (float64
    # stays float64; a float16 weight is promoted by the product).
    dtype = torch.promote_types(pred.dtype, torch.float32)
    pred = pred.to(dtype)
    loss = loss_map(pred, clean_score_targets(target.to(dtype)))
    if loss.numel() == 0 and reduction != 'none':
        return loss.sum()
    if isinstance(avg_factor, Tensor):
        divisor_dtype = torch.promote_types(avg_factor.dtype, dtype)
        avg_factor = avg_factor.to(divisor_dtype).clamp(min=min_avg_factor)
    elif avg_factor is not None:
        avg_factor = max(avg_factor, min_avg_factor)
    if divisor_eps is None or avg_factor is None or reduction != 'mean':
        return weight_reduce_loss(loss, weight, reduction, avg_factor)
    if weight is not None:
        loss = loss * weight
    return loss.sum() / (avg_factor + divisor_eps)
