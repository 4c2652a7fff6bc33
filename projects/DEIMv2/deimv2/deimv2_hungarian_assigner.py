"""Hungarian matching whose cost changes at an epoch (DEIMv2's matcher)."""
import logging
from typing import List, Optional, Union

from mmdet.models.task_modules.assigners import AssignResult, HungarianAssigner
from mmdet.registry import TASK_UTILS
from mmengine.config import ConfigDict
from mmengine.logging import print_log
from mmengine.structures import InstanceData


@TASK_UTILS.register_module()
class DEIMv2HungarianAssigner(HungarianAssigner):
    """mmdet's :class:`HungarianAssigner` with upstream DEIMv2's matcher
    change (``HungarianMatcher``: ``change_matcher``, ``iou_order_alpha``,
    ``matcher_change_epoch``).

    Until ``matcher_change_epoch`` the cost is ``match_costs`` (DEIMv2's
    configs: D-FINE's focal, L1 and GIoU costs); from that epoch on, with
    ``change_matcher``, it is :class:`ScoreIoUProductCost`
    ``-(p * IoU ** iou_order_alpha)`` alone, as upstream's matcher computes
    when its ``epoch`` argument reaches ``matcher_change_epoch``.

    Upstream passes the training epoch to the matcher at every call; here
    the epoch is state, set before every training epoch by
    :class:`SetEpochHook` (through :meth:`DEIMv2Head.set_epoch`) from the
    runner's epoch, which every rank has alike (a resumed run continues at
    the cost of the epoch it resumes at). Matching is per rank and issues
    no collective, so the change adds nothing DDP has to agree on.

    Args:
        match_costs (list[dict] | dict): The costs before the change, as
            :class:`HungarianAssigner`'s.
        change_matcher (bool): Switch to the product cost at
            ``matcher_change_epoch``. Defaults to False (upstream's
            default; every DEIMv2 config sets True).
        iou_order_alpha (float): The power of the IoU in the product cost.
            Defaults to 1.0 (upstream's default; its configs use 4.0).
        matcher_change_epoch (int): First epoch (0-based, the runner's
            ``epoch``) matched with the product cost. Defaults to 10000
            (upstream's default).
    """

    def __init__(self,
                 match_costs: Union[List[Union[dict, ConfigDict]], dict,
                                    ConfigDict],
                 change_matcher: bool = False,
                 iou_order_alpha: float = 1.0,
                 matcher_change_epoch: int = 10000) -> None:
        super().__init__(match_costs)
        if not isinstance(change_matcher, bool):
            raise TypeError(
                'DEIMv2HungarianAssigner.change_matcher must be True or '
                f'False, got {change_matcher!r}.')
        if isinstance(matcher_change_epoch, bool) or not isinstance(
                matcher_change_epoch, int) or matcher_change_epoch < 0:
            raise ValueError(
                'DEIMv2HungarianAssigner.matcher_change_epoch must be an '
                'epoch index (an int >= 0, the runner\'s 0-based epoch), got '
                f'{matcher_change_epoch!r}; e.g. 450 for DEIMv2-Atto.')
        self.change_matcher = change_matcher
        self.iou_order_alpha = iou_order_alpha
        self.matcher_change_epoch = matcher_change_epoch
        self.early_costs = self.match_costs
        self.late_costs = [
            TASK_UTILS.build(
                dict(type='ScoreIoUProductCost', iou_order=iou_order_alpha))
        ]
        self.epoch: Optional[int] = None
        self._warned_no_epoch = False

    @property
    def changed(self) -> bool:
        """Whether the product cost is in use (the epoch has reached
        ``matcher_change_epoch`` with ``change_matcher``)."""
        return self.match_costs is self.late_costs

    def set_epoch(self, epoch: int) -> None:
        """Select the costs of ``epoch`` (the training epoch that starts).
        """
        self.epoch = epoch
        late = self.change_matcher and epoch >= self.matcher_change_epoch
        if late and not self.changed:
            print_log(
                f'DEIMv2HungarianAssigner: epoch {epoch}: matching with '
                f'-(p * IoU^{self.iou_order_alpha:g}) from now on '
                f'(matcher_change_epoch={self.matcher_change_epoch}).',
                logger='current')
        self.match_costs = self.late_costs if late else self.early_costs

    def assign(self,
               pred_instances: InstanceData,
               gt_instances: InstanceData,
               img_meta: Optional[dict] = None,
               **kwargs) -> AssignResult:
        """``HungarianAssigner.assign`` with the costs :meth:`set_epoch`
        selected. Differs only by a warning, once, when ``change_matcher``
        is set and no epoch was ever given (no :class:`SetEpochHook` in
        ``custom_hooks``): the change would then never happen."""
        if self.change_matcher and self.epoch is None and \
                not self._warned_no_epoch:
            self._warned_no_epoch = True
            print_log(
                'DEIMv2HungarianAssigner: change_matcher is set but no epoch '
                'was given, so the matching cost will not change at '
                f'matcher_change_epoch={self.matcher_change_epoch}. Add '
                "dict(type='SetEpochHook') to custom_hooks (DEIMv2's configs "
                'have it).',
                logger='current',
                level=logging.WARNING)
        return super().assign(pred_instances, gt_instances, img_meta, **kwargs)
