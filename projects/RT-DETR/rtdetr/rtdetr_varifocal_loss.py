"""RT-DETR's IoU-aware varifocal loss, finite on every edge case."""
from typing import Optional, Union

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import Tensor

from mmddp_ext.models.losses import SafeVarifocalLoss


@MODELS.register_module()
class RTDETRVarifocalLoss(SafeVarifocalLoss):
    """The varifocal loss of upstream RT-DETR's ``loss_labels_vfl``, with
    the edge-case guards of :class:`SafeVarifocalLoss`.

    For logits ``p``, one-hot GT classes ``y`` and IoU-aware score targets
    ``t = y * IoU(matched box, GT)``::

        w = alpha * sigmoid(p).detach() ** gamma * (1 - y) + t
        loss = sum(w * BCEWithLogits(p, t)) / avg_factor

    Differs from ``SafeVarifocalLoss.forward`` (mmdet's
    ``varifocal_loss``) in two ways, both to train like upstream: the
    modulating factor is detached (mmdet back-propagates through it), and
    a matched class whose box has IoU 0 gets weight 0 rather than the
    negatives' ``alpha * sigmoid(p) ** gamma``; that needs the one-hot
    ``y``, passed as ``labels``. The guards are the same: empty ``pred``
    returns ``pred.sum()`` (0, in the graph), ``avg_factor`` is raised to
    ``min_avg_factor``, and non-finite targets become finite.

    Args:
        alpha (float): Weight of the negatives' term. Defaults to 0.75.
        gamma (float): Exponent of the modulating factor. Defaults to 2.0.
        reduction (str): 'none', 'mean' or 'sum'. With 'mean' and an
            ``avg_factor`` the loss is the sum divided by it, as upstream
            normalises by the number of GT boxes. Defaults to 'mean'.
        loss_weight (float): Weight of the loss. Defaults to 1.0.
        min_avg_factor (float): Lower bound applied to ``avg_factor``.
            Defaults to 1.0.
        **kwargs: Other keys of :class:`SafeVarifocalLoss`
            (``use_sigmoid``, which must stay True).
    """

    def forward(self,
                pred: Tensor,
                target: Tensor,
                weight: Optional[Tensor] = None,
                avg_factor: Optional[Union[float, Tensor]] = None,
                reduction_override: Optional[str] = None,
                labels: Optional[Tensor] = None) -> Tensor:
        """Loss of ``pred`` logits against IoU-aware score targets.

        Args:
            pred (Tensor): Classification logits, shape (N, C).
            target (Tensor): IoU-aware score targets ``t``, shape (N, C).
            weight (Tensor, optional): Weights broadcastable to (N, C),
                e.g. per-query label weights of shape (N, 1). Defaults to
                None.
            avg_factor (float | Tensor, optional): Divisor of the summed
                loss. Defaults to None.
            reduction_override (str, optional): Overrides ``reduction``.
                Defaults to None.
            labels (Tensor, optional): One-hot GT classes ``y``, shape
                (N, C). Defaults to None, i.e. ``t > 0``.

        Returns:
            Tensor: The loss; element-wise when the reduction is 'none'.
        """
        if pred.shape != target.shape:
            raise ValueError(
                'RTDETRVarifocalLoss needs pred and target of the same shape '
                f'(N, num_classes), but got {tuple(pred.shape)} and '
                f'{tuple(target.shape)}.')
        reduction = reduction_override or self.reduction
        if reduction not in ('none', 'mean', 'sum'):
            raise ValueError("reduction must be 'none', 'mean' or 'sum', "
                             f'but got {reduction!r}.')
        if pred.numel() == 0 and reduction != 'none':
            return pred.sum()
        target = torch.nan_to_num(
            target, nan=0.0, posinf=1.0, neginf=0.0).type_as(pred)
        if labels is None:
            labels = target > 0
        modulating = pred.detach().sigmoid().pow(self.gamma)
        focal_weight = (
            self.alpha * modulating * (1 - labels.type_as(pred)) + target)
        loss = F.binary_cross_entropy_with_logits(
            pred, target, reduction='none') * focal_weight
        if weight is not None:
            loss = loss * weight
        if reduction == 'none':
            return self.loss_weight * loss
        loss = loss.sum()
        if reduction == 'mean':
            if avg_factor is None:
                avg_factor = pred.numel()
            elif isinstance(avg_factor, Tensor):
                avg_factor = avg_factor.clamp(min=self.min_avg_factor)
            else:
                avg_factor = max(avg_factor, self.min_avg_factor)
            loss = loss / avg_factor
        return self.loss_weight * loss
