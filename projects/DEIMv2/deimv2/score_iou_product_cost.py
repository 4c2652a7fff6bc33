"""DEIMv2's late matching cost: class probability times a power of IoU."""
from typing import Optional, Union

from mmdet.models.task_modules.assigners.match_cost import BaseMatchCost
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import bbox_overlaps
from mmengine.structures import InstanceData
from torch import Tensor

from mmddp_ext.utils import full_precision


@TASK_UTILS.register_module()
class ScoreIoUProductCost(BaseMatchCost):
    """``-(p * IoU ** iou_order)``: upstream DEIMv2's matching cost once its
    ``HungarianMatcher`` has changed (``change_matcher``, from
    ``matcher_change_epoch`` on), with ``p`` the sigmoid of the predicted
    logit of the GT's class and ``IoU`` the plain IoU (not GIoU) of the
    predicted and GT boxes. A query is matched for being confident and well
    placed at once; a large ``iou_order`` lets the box decide.

    Args:
        iou_order (float): The power of the IoU (upstream
            ``iou_order_alpha``). Defaults to 1.0.
        weight (float): Multiplier of the cost; upstream has none (1).
            Defaults to 1.0.
    """

    def __init__(self,
                 iou_order: float = 1.0,
                 weight: Union[float, int] = 1.0) -> None:
        super().__init__(weight=weight)
        number = isinstance(iou_order,
                            (int, float)) and not isinstance(iou_order, bool)
        if not number or iou_order <= 0:
            raise ValueError(
                'ScoreIoUProductCost.iou_order (upstream iou_order_alpha) '
                f'must be a positive number, got {iou_order!r}; upstream '
                'DEIMv2 uses 4.0.')
        self.iou_order = float(iou_order)

    def __call__(self,
                 pred_instances: InstanceData,
                 gt_instances: InstanceData,
                 img_meta: Optional[dict] = None,
                 **kwargs) -> Tensor:
        """The cost matrix, (num_preds, num_gts).

        Args:
            pred_instances (:obj:`InstanceData`): ``scores``: class logits
                (num_preds, num_classes); ``bboxes``: (x1, y1, x2, y2),
                any common scale with the GT.
            gt_instances (:obj:`InstanceData`): ``labels`` and ``bboxes``.
            img_meta (dict, optional): Unused.
        """
        # full precision under autocast: pixel-box areas overflow float16
        # from 256 x 256 px on, and a cost difference below its resolution
        # would decide a match
        scores = full_precision(pred_instances.scores)
        probabilities = scores.sigmoid()[:, gt_instances.labels]
        ious = bbox_overlaps(
            full_precision(pred_instances.bboxes),
            full_precision(gt_instances.bboxes).to(scores.dtype))
        return -(probabilities * ious.pow(self.iou_order)) * self.weight
