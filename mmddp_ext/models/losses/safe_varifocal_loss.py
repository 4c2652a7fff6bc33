"""Varifocal loss that stays finite on the edge cases of DETR training."""
from typing import Optional, Union

import torch
from mmdet.models.losses import VarifocalLoss
from mmdet.registry import MODELS
from torch import Tensor

REDUCTIONS = (None, 'none', 'mean', 'sum')


@MODELS.register_module()
class SafeVarifocalLoss(VarifocalLoss):
    """``VarifocalLoss`` that is finite with zero positives, empty inputs
    or IoU targets of degenerate boxes.

    Differs from ``VarifocalLoss.forward`` only on three inputs, where
    upstream returns NaN or a loss blown up by ``1 / eps``; otherwise it
    calls ``super().forward`` on the same arguments:

    - Empty ``pred``: upstream's ``reduction='mean'`` without
      ``avg_factor`` is the mean of an empty tensor (NaN). Here any
      reducing call returns ``pred.sum()``, an exact 0 that stays in the
      graph, so DDP still sees the classifier used.
    - ``avg_factor`` below ``min_avg_factor`` (zero positives on a rank):
      upstream divides by ``avg_factor + eps``, multiplying the negatives'
      loss by about 8e6. Here ``avg_factor`` is raised to
      ``min_avg_factor``, as DETR heads clamp their box counts to 1.
    - Non-finite ``target``: the IoU of a zero-area box computed without
      an epsilon is 0/0. NaN and -inf targets become 0 (a zero-area box
      overlaps nothing) and +inf becomes 1, so the loss and its gradient
      stay finite.

    Args:
        use_sigmoid (bool): Must be True, as upstream. Defaults to True.
        alpha (float): Weight of the negatives' term. Defaults to 0.75.
        gamma (float): Exponent of the modulating factor. Defaults to 2.0.
        iou_weighted (bool): Weight positives by their IoU target.
            Defaults to True.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        min_avg_factor (float): Lower bound applied to ``avg_factor``.
            Must be > 0. Defaults to 1.0.
    """

    def __init__(self,
                 use_sigmoid: bool = True,
                 alpha: float = 0.75,
                 gamma: float = 2.0,
                 iou_weighted: bool = True,
                 reduction: str = 'mean',
                 loss_weight: float = 1.0,
                 min_avg_factor: float = 1.0) -> None:
        if not use_sigmoid:
            raise ValueError(
                'SafeVarifocalLoss supports only use_sigmoid=True (as '
                'mmdet VarifocalLoss), but got use_sigmoid=False. Remove '
                'the key or set it to True.')
        if reduction not in REDUCTIONS[1:]:
            raise ValueError(
                f'SafeVarifocalLoss reduction must be one of {REDUCTIONS[1:]}'
                f', but got {reduction!r}.')
        if not min_avg_factor > 0:
            raise ValueError(
                'SafeVarifocalLoss min_avg_factor must be > 0 (it bounds '
                f'the divisor of the loss), but got {min_avg_factor}. Use '
                'the default 1.0 unless avg_factor is a fraction by design.')
        super().__init__(
            use_sigmoid=use_sigmoid,
            alpha=alpha,
            gamma=gamma,
            iou_weighted=iou_weighted,
            reduction=reduction,
            loss_weight=loss_weight)
        self.min_avg_factor = min_avg_factor

    def forward(self,
                pred: Tensor,
                target: Tensor,
                weight: Optional[Tensor] = None,
                avg_factor: Optional[Union[float, Tensor]] = None,
                reduction_override: Optional[str] = None) -> Tensor:
        """Varifocal loss of ``pred`` logits against IoU-aware targets.

        Args:
            pred (Tensor): Classification logits, shape (N, C).
            target (Tensor): IoU-aware score targets in [0, 1], shape
                (N, C); zero for negatives.
            weight (Tensor, optional): Element-wise weights. Defaults to
                None.
            avg_factor (float | Tensor, optional): Divisor of the summed
                loss, raised to ``min_avg_factor``. Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum' to
                override ``reduction``. Defaults to None.

        Returns:
            Tensor: The loss; element-wise when the reduction is 'none'.
        """
        if reduction_override not in REDUCTIONS:
            raise ValueError(
                f'reduction_override must be one of {REDUCTIONS}, but got '
                f'{reduction_override!r}.')
        if pred.shape != target.shape:
            raise ValueError(
                'SafeVarifocalLoss needs pred and target of the same shape '
                f'(N, num_classes), but got {tuple(pred.shape)} and '
                f'{tuple(target.shape)}. Build target as a score map, '
                'e.g. one-hot labels times the IoU of the matched box.')
        reduction = reduction_override or self.reduction
        if pred.numel() == 0 and reduction != 'none':
            return pred.sum()
        if isinstance(avg_factor, Tensor):
            avg_factor = avg_factor.clamp(min=self.min_avg_factor)
        elif avg_factor is not None:
            avg_factor = max(avg_factor, self.min_avg_factor)
        # Unconditional: finite targets pass unchanged, and testing for
        # non-finite ones first would cost a device sync per call.
        target = torch.nan_to_num(target, nan=0.0, posinf=1.0, neginf=0.0)
        return super().forward(
            pred,
            target,
            weight=weight,
            avg_factor=avg_factor,
            reduction_override=reduction_override)
