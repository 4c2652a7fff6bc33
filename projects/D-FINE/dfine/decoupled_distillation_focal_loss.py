"""D-FINE's decoupled distillation focal (DDF) loss (GO-LSD)."""
from typing import Union

import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import Tensor, nn

from mmddp_ext.utils import full_precision

Number = Union[float, Tensor]


@MODELS.register_module()
class DecoupledDistillationFocalLoss(nn.Module):
    """Decoupled distillation focal loss of D-FINE's global-optimal
    localization self-distillation (GO-LSD; paper Eq. 7; upstream
    ``loss_local``'s ``loss_ddf``).

    An earlier decoder layer's edge distributions learn from the last
    layer's (the teacher, detached) by KL divergence at temperature ``T``::

        l_e = weight_e * T ** 2 * KL(softmax(teacher_e / T) ||
                                     softmax(pred_e / T))

    with ``weight_e`` the IoU of the query's box with its GT for matched
    queries and the teacher's best class score otherwise. Matched and
    unmatched edges are averaged separately and mixed with the weights
    ``sqrt(count * 8 / batch_size)`` of each group, so that neither
    dominates.

    Differs from upstream in one way, for DDP: the means divide each
    rank's sum by the group's edge count *averaged over ranks*
    (``pos_avg_factor``, ``neg_avg_factor``; upstream divides by the
    rank's own count), and the mixing weights use those averages too. On
    one rank the two are the same; with several, each edge weighs the same
    whichever rank holds it, and a rank without matched edges contributes
    an exact 0 instead of skipping the term.

    Args:
        temperature (float): ``T``. Defaults to 5.0.
        loss_weight (float): Weight of the loss (upstream ``loss_ddf``:
            1.5). Defaults to 1.5.
    """

    def __init__(self,
                 temperature: float = 5.0,
                 loss_weight: float = 1.5) -> None:
        super().__init__()
        if not temperature > 0:
            raise ValueError(
                'DecoupledDistillationFocalLoss temperature must be > 0, '
                f'but got {temperature}; upstream uses 5.')
        self.temperature = temperature
        self.loss_weight = loss_weight

    def forward(self, pred: Tensor, teacher: Tensor, weight: Tensor,
                matched: Tensor, pos_avg_factor: Number,
                neg_avg_factor: Number, pos_mix: Number,
                neg_mix: Number) -> Tensor:
        """The mixed loss.

        Args:
            pred (Tensor): Edge logits of the student layer, (N, bins).
            teacher (Tensor): Edge logits of the last layer, (N, bins);
                detached here.
            weight (Tensor): Per-edge weights, (N,); 0 removes an edge.
            matched (Tensor): Bool (N,), edges of matched queries.
            pos_avg_factor (float | Tensor): Divisor of the matched sum,
                > 0.
            neg_avg_factor (float | Tensor): Divisor of the unmatched sum,
                > 0.
            pos_mix (float | Tensor): Mixing weight of the matched mean.
            neg_mix (float | Tensor): Mixing weight of the unmatched mean;
                ``pos_mix + neg_mix`` must be > 0.

        Returns:
            Tensor: The loss; finite and connected to the graph also when
            ``pred`` is empty or no edge is matched.
        """
        t = self.temperature
        # Full precision under autocast too: CUDA autocast runs softmax and
        # log_softmax in float32, CPU autocast in the input's float16, where
        # the rounding of the two distributions alone gives KL(p || p) about
        # 1e-3 instead of 0 (measured on D-FINE-tiny, whose layers start
        # with identical edge distributions): noise the size of the signal.
        pred, teacher = full_precision(pred), full_precision(teacher.detach())
        per_edge = F.kl_div(
            F.log_softmax(pred / t, dim=1),
            F.softmax(teacher / t, dim=1),
            reduction='none').sum(-1) * (t**2) * weight.detach().to(pred.dtype)
        pos = per_edge[matched].sum() / pos_avg_factor
        neg = per_edge[~matched].sum() / neg_avg_factor
        loss = (pos * pos_mix + neg * neg_mix) / (pos_mix + neg_mix)
        return self.loss_weight * loss
