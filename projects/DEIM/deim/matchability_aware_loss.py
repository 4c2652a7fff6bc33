"""DEIM's Matchability-Aware Loss (MAL)."""
from typing import Optional

import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import Tensor

from .ports import RTDETRVarifocalLoss


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

    Overrides ``loss_map`` only: the reduction and its guards are those
    of every IoU-aware loss here (``SafeVarifocalLoss.forward``,
    ``guarded_score_loss``): an empty ``pred`` gives an exact 0 in the
    graph, ``avg_factor`` is raised to ``min_avg_factor``, non-finite
    targets become finite (NaN 0, +inf 1), float16 is computed in
    float32, and the sum is divided by ``avg_factor`` itself
    (``divisor_eps = 0``, from ``RTDETRVarifocalLoss``), as upstream
    divides by ``num_boxes``. Non-finite logits are not replaced: they
    make the loss NaN, which mmddp_ext's all-ranks check then skips on
    every rank (upstream replaces every NaN loss by 0 with ``nan_to_num``
    and trains on); a NaN box does the same through the box losses.

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

    def loss_map(self,
                 pred: Tensor,
                 target: Tensor,
                 labels: Optional[Tensor] = None) -> Tensor:
        """Element-wise MAL of ``pred`` logits against IoU-aware targets
        (see the class doc), for :meth:`SafeVarifocalLoss.forward` to
        reduce; arguments as :meth:`RTDETRVarifocalLoss.loss_map`,
        ``labels`` (the one-hot ``y``) defaulting to ``target > 0``."""
        if labels is None:
            labels = target > 0
        labels = labels.type_as(pred)
        modulating = pred.detach().sigmoid().pow(self.gamma)
        loss_weight = self.alpha * modulating * (1 - labels) + labels
        return F.binary_cross_entropy_with_logits(
            pred, target.pow(self.gamma), reduction='none') * loss_weight
