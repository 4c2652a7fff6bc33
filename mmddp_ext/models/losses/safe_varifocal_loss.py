"""Varifocal loss that stays finite on the edge cases of DETR training."""
from functools import partial
from typing import Optional, Union

from mmdet.models.losses import VarifocalLoss
from mmdet.models.losses.varifocal_loss import varifocal_loss
from mmdet.registry import MODELS
from torch import Tensor

from .guarded_score_loss import guarded_score_loss

REDUCTIONS = (None, 'none', 'mean', 'sum')


@MODELS.register_module()
class SafeVarifocalLoss(VarifocalLoss):
    """``VarifocalLoss`` that is finite with zero positives, empty inputs
    or IoU targets of degenerate boxes, and the base of the IoU-aware
    classification losses of the DETR ports.

    Replaces ``VarifocalLoss.forward``: the element-wise map is mmdet's
    ``varifocal_loss`` (:meth:`loss_map`), and the guarded reduction
    :func:`guarded_score_loss` reduces it. Subclasses (RT-DETR's
    varifocal loss, DEIM's matchability-aware loss) override
    :meth:`loss_map` only. The result equals upstream's bit for bit except
    on three inputs, where upstream returns NaN or a loss blown up by
    ``1 / eps``:

    - Empty ``pred``: upstream's ``reduction='mean'`` without
      ``avg_factor`` is the mean of an empty tensor (NaN). Here any
      reducing call returns an exact 0 that stays in the graph, so DDP
      still sees the classifier used.
    - ``avg_factor`` below ``min_avg_factor`` (zero positives on a rank):
      upstream divides by ``avg_factor + eps``, multiplying the negatives'
      loss by about 8e6. Here ``avg_factor`` is raised to
      ``min_avg_factor``, as DETR heads clamp their box counts to 1.
    - Non-finite ``target``: the IoU of a zero-area box computed without
      an epsilon is 0/0. NaN and -inf targets become 0 (a zero-area box
      overlaps nothing) and +inf becomes 1, so the loss and its gradient
      stay finite. Non-finite ``pred`` is not touched.

    Float16 inputs, or a call under autocast, are computed and reduced in
    float32 (the result is float32).

    ``divisor_eps`` (a class attribute, not a config key) is what the
    reduction adds to ``avg_factor``: None here, mmdet's float32 epsilon as
    ``VarifocalLoss``; 0 in the DETR ports, whose upstream divides by the
    box count itself (so that their losses equal upstream's in float64).

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

    divisor_eps: Optional[float] = None

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
                reduction_override: Optional[str] = None,
                **map_kwargs) -> Tensor:
        """Loss of ``pred`` logits against IoU-aware targets: the map of
        :meth:`loss_map` through :func:`guarded_score_loss`.

        Args:
            pred (Tensor): Classification logits, shape (N, C).
            target (Tensor): IoU-aware score targets in [0, 1], shape
                (N, C); zero for negatives.
            weight (Tensor, optional): Weights broadcastable to (N, C),
                e.g. per-query label weights of shape (N, 1). Defaults to
                None.
            avg_factor (float | Tensor, optional): Divisor of the summed
                loss, raised to ``min_avg_factor``. Defaults to None.
            reduction_override (str, optional): 'none', 'mean' or 'sum' to
                override ``reduction``. Defaults to None.
            **map_kwargs: Further inputs of a subclass's :meth:`loss_map`
                (``labels``); none here.

        Returns:
            Tensor: The loss, at least float32; element-wise when the
            reduction is 'none'.
        """
        if reduction_override not in REDUCTIONS:
            raise ValueError(
                f'reduction_override must be one of {REDUCTIONS}, but got '
                f'{reduction_override!r}.')
        if pred.shape != target.shape:
            raise ValueError(
                f'{type(self).__name__} needs pred and target of the same '
                f'shape (N, num_classes), but got {tuple(pred.shape)} and '
                f'{tuple(target.shape)}. Build target as a score map, '
                'e.g. one-hot labels times the IoU of the matched box.')
        loss = guarded_score_loss(
            partial(self.loss_map, **map_kwargs),
            pred,
            target,
            weight=weight,
            reduction=reduction_override or self.reduction,
            avg_factor=avg_factor,
            min_avg_factor=self.min_avg_factor,
            divisor_eps=self.divisor_eps)
        return self.loss_weight * loss

    def loss_map(self, pred: Tensor, target: Tensor) -> Tensor:
        """Element-wise varifocal loss (mmdet's ``varifocal_loss``,
        unreduced).

        Args:
            pred (Tensor): Logits, shape (N, C), at least float32.
            target (Tensor): Finite score targets, shape (N, C), of
                ``pred``'s dtype.

        Returns:
            Tensor: The loss of each logit, shape (N, C).
        """
        return varifocal_loss(
            pred,
            target,
            alpha=self.alpha,
            gamma=self.gamma,
            iou_weighted=self.iou_weighted,
            reduction='none')
