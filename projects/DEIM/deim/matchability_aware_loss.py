"""DEIM's Matchability-Aware Loss (MAL)."""
from typing import Optional, Union

import torch.nn.functional as F
from mmdet.models.losses.utils import weight_reduce_loss
from mmdet.registry import MODELS
from torch import Tensor

from .dfine_port import RTDETRVarifocalLoss


@MODELS.register_module()
class MatchabilityAwareLoss(RTDETRVarifocalLoss):
    """DEIM's MAL (``loss_labels_mal`` of ``engine/deim/deim_criterion.py``)
    with the signature of :class:`RTDETRVarifocalLoss`, so that the D-FINE
    and RT-DETR heads take it as their ``loss_cls``.

    For logits ``p``, one-hot GT classes ``y`` and IoU-aware targets
    ``t = y * IoU(matched box, GT)``::

        w = alpha * sigmoid(p).detach() ** gamma * (1 - y) + y
        loss = sum(w * BCEWithLogits(p, t ** gamma)) / avg_factor

    Differs from the varifocal loss (``super()``) in both places DEIM
    changes it: the target is ``t ** gamma`` (a low-IoU match still gets a
    target clearly above 0), and a matched class has weight 1 instead of
    ``t``. ``alpha`` is upstream's ``mal_alpha`` (None there: 1).

    Unlike ``super()``, non-finite targets are not replaced: a NaN box
    makes the loss NaN, which mmddp_ext's all-ranks check then skips on
    every rank (upstream replaces every NaN loss by 0 with
    ``nan_to_num`` and trains on). An empty ``pred`` gives ``pred.sum()``
    (0, in the graph); ``avg_factor`` is raised to ``min_avg_factor``, and
    mmdet's ``weight_reduce_loss`` reduces (it adds float32's eps to the
    divisor: 1e-7 relative).

    Args:
        alpha (float): Weight of the negatives (upstream ``mal_alpha``).
            Defaults to 1.0.
        gamma (float): Exponent of the target and of the modulating factor
            (upstream ``gamma``, 1.5 in every DEIM config). Defaults to 1.5.
        reduction (str): 'none', 'mean' or 'sum'. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        min_avg_factor (float): Lower bound of ``avg_factor``. Defaults to
            1.0.
        **kwargs: Other keys of :class:`RTDETRVarifocalLoss`.
    """

    def __init__(self,
                 alpha: float = 1.0,
                 gamma: float = 1.5,
                 **kwargs) -> None:
        super().__init__(alpha=alpha, gamma=gamma, **kwargs)

    def forward(self,
                pred: Tensor,
                target: Tensor,
                weight: Optional[Tensor] = None,
                avg_factor: Optional[Union[float, Tensor]] = None,
                reduction_override: Optional[str] = None,
                labels: Optional[Tensor] = None) -> Tensor:
        """MAL of ``pred`` logits against IoU-aware targets (see the class
        doc); arguments as :meth:`RTDETRVarifocalLoss.forward`, ``labels``
        (the one-hot ``y``) defaulting to ``target > 0``."""
        if pred.shape != target.shape:
            raise ValueError(
                'MatchabilityAwareLoss needs pred and target of the same '
                f'shape (N, num_classes), but got {tuple(pred.shape)} and '
                f'{tuple(target.shape)}.')
        reduction = reduction_override or self.reduction
        if reduction not in ('none', 'mean', 'sum'):
            raise ValueError("reduction must be 'none', 'mean' or 'sum', "
                             f'but got {reduction!r}.')
        if pred.numel() == 0 and reduction != 'none':
            return pred.sum()
        if labels is None:
            labels = target > 0
        labels = labels.type_as(pred)
        modulating = pred.detach().sigmoid().pow(self.gamma)
        loss_weight = self.alpha * modulating * (1 - labels) + labels
        loss = F.binary_cross_entropy_with_logits(
            pred, target.type_as(pred).pow(self.gamma),
            reduction='none') * loss_weight
        if avg_factor is not None and reduction == 'mean':
            avg_factor = (
                avg_factor.clamp(
                    min=self.min_avg_factor) if isinstance(avg_factor, Tensor)
                else max(avg_factor, self.min_avg_factor))
        return self.loss_weight * weight_reduce_loss(loss, weight, reduction,
                                                     avg_factor)
