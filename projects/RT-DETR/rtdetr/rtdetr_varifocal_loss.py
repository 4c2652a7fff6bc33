"""RT-DETR's IoU-aware varifocal loss, finite on every edge case."""
from typing import Optional

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

    Overrides ``SafeVarifocalLoss.loss_map`` (mmdet's ``varifocal_loss``)
    only, and differs from it in two ways, both to train like upstream:
    the modulating factor is detached (mmdet back-propagates through it),
    and a matched class whose box has IoU 0 gets weight 0 rather than the
    negatives' ``alpha * sigmoid(p) ** gamma``; that needs the one-hot
    ``y``, passed to ``forward`` as ``labels``. The reduction and its
    guards are :class:`SafeVarifocalLoss`'s (``guarded_score_loss``):
    empty ``pred`` gives an exact 0 in the graph, ``avg_factor`` is raised
    to ``min_avg_factor`` (upstream clamps ``num_boxes`` to 1 too),
    non-finite targets become finite, float16 is computed in float32.
    The sum is divided by ``avg_factor`` itself (``divisor_eps = 0``), as
    upstream divides by ``num_boxes``, not by mmdet's ``avg_factor + eps``
    (one float32 rounding of the divisor apart, 2e-7 relative at most).

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

    # Upstream divides the summed loss by the box count, with no epsilon.
    divisor_eps = 0.0

    def forward(self,
                *args,
                labels: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        """``SafeVarifocalLoss.forward`` (same arguments), with ``labels``,
        the one-hot ``y`` of :meth:`loss_map`, named in the signature:
        the D-FINE head checks that its ``loss_cls`` takes it."""
        return super().forward(*args, labels=labels, **kwargs)

    def loss_map(self,
                 pred: Tensor,
                 target: Tensor,
                 labels: Optional[Tensor] = None) -> Tensor:
        """Element-wise loss of ``pred`` logits against IoU-aware score
        targets, for :meth:`SafeVarifocalLoss.forward` to reduce.

        Args:
            pred (Tensor): Classification logits, shape (N, C).
            target (Tensor): Finite IoU-aware score targets ``t``, shape
                (N, C), of ``pred``'s dtype.
            labels (Tensor, optional): One-hot GT classes ``y``, shape
                (N, C), passed to ``forward`` as ``labels=``. Defaults to
                None, i.e. ``t > 0``.

        Returns:
            Tensor: The loss of each logit, shape (N, C).
        """
        if labels is None:
            labels = target > 0
        modulating = pred.detach().sigmoid().pow(self.gamma)
        focal_weight = (
            self.alpha * modulating * (1 - labels.type_as(pred)) + target)
        return F.binary_cross_entropy_with_logits(
            pred, target, reduction='none') * focal_weight
