"""D-FINE's fine-grained localization (FGL) loss."""
from typing import Optional, Union

import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import Tensor, nn


@MODELS.register_module()
class FineGrainedLocalizationLoss(nn.Module):
    """Fine-grained localization loss (D-FINE paper, Eq. 6; upstream
    ``unimodal_distribution_focal_loss``).

    Each GT edge offset lies between two bins ``left`` and ``left + 1`` of
    the weighting function, with interpolation weights ``w_left`` and
    ``w_right`` (:func:`bbox2distance`). The loss of one edge distribution
    ``p`` (logits over ``reg_max + 1`` bins) is::

        (CE(p, left) * w_left + CE(p, left + 1) * w_right) * weight

    with ``weight`` the IoU of the predicted box with its GT. Unlike
    mmdet's ``DistributionFocalLoss`` (uniform bins, weights from the
    position), the weights come from the non-uniform bins.

    Args:
        loss_weight (float): Weight of the loss (upstream ``loss_fgl``:
            0.15). Defaults to 0.15.
    """

    def __init__(self, loss_weight: float = 0.15) -> None:
        super().__init__()
        self.loss_weight = loss_weight

    def forward(self,
                pred: Tensor,
                position: Tensor,
                weight_right: Tensor,
                weight_left: Tensor,
                weight: Optional[Tensor] = None,
                avg_factor: Optional[Union[float, Tensor]] = None) -> Tensor:
        """Sum of the per-edge losses divided by ``avg_factor``.

        Args:
            pred (Tensor): Edge logits, (N, reg_max + 1).
            position (Tensor): Bin positions, (N,); the left bin is
                ``position.long()``.
            weight_right (Tensor): (N,).
            weight_left (Tensor): (N,).
            weight (Tensor, optional): Per-edge weights, (N,). Defaults to
                None.
            avg_factor (float | Tensor, optional): Divisor (the number of
                matched boxes averaged over ranks, upstream's
                ``num_boxes``). Defaults to None, i.e. the plain sum.

        Returns:
            Tensor: The weighted loss; an empty ``pred`` gives 0 connected
            to the graph.
        """
        left = position.long()
        loss = (
            F.cross_entropy(pred, left, reduction='none') * weight_left +
            F.cross_entropy(pred, left + 1, reduction='none') * weight_right)
        if weight is not None:
            loss = loss * weight.to(loss.dtype)
        loss = loss.sum()
        if avg_factor is not None:
            loss = loss / avg_factor
        return self.loss_weight * loss
