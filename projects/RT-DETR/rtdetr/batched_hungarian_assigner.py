"""Hungarian matching of every image of several prediction sets at once."""
from typing import List, Sequence, Tuple

import numpy as np
import torch
from mmdet.models.task_modules import HungarianAssigner
from mmdet.registry import TASK_UTILS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor

from .host_to_device import host_to_device

# Boxes reach the match costs normalized, so the costs' own normalisation
# by the image size (BBoxL1Cost) divides by 1.
UNIT_IMAGE = dict(img_shape=(1, 1))


@TASK_UTILS.register_module()
class BatchedHungarianAssigner(HungarianAssigner):
    """``HungarianAssigner`` that also matches a whole batch, for several
    prediction sets (decoder layers, encoder queries), in one pass.

    ``assign`` (one image) is ``HungarianAssigner.assign``, unchanged.
    :meth:`assign_batch` gives the same matches for every image of every
    set with one call of each match cost per set and one device-to-host
    copy for all sets (upstream RT-DETR's ``HungarianMatcher`` makes one
    per set); ``assign`` per image makes one per image and set, and each
    makes the host wait for the device.

    Each match cost is called once per set on the batch's queries against
    the batch's GT (its ``(bs * num_queries, num_gts)`` matrix, of which
    each image keeps its own columns), with the boxes normalized by their
    image's size and ``img_shape`` (1, 1). Every mmdet cost is pairwise,
    so each image's block is the cost ``assign`` computes for it, up to
    float rounding where the per-image path normalizes after converting
    the box format (``BBoxL1Cost``) or measures GIoU in pixels
    (``IoUCost``, scale-invariant); the matching is then the same unless
    two assignments' total costs tie to within that rounding.

    Args:
        match_costs (dict | list[dict]): Match cost configs, as for
            ``HungarianAssigner``.
    """

    @torch.no_grad()
    def assign_batch(
            self, cls_scores: Sequence[Tensor], bbox_preds: Sequence[Tensor],
            gt_labels: Tensor, gt_bboxes: Tensor,
            num_gts: Sequence[int]) -> List[Tuple[np.ndarray, np.ndarray]]:
        """Match the queries of every image of every set to its GT.

        Args:
            cls_scores (Sequence[Tensor]): Per set, logits (bs,
                num_queries, num_classes).
            bbox_preds (Sequence[Tensor]): Per set, normalized (cx, cy, w,
                h) boxes (bs, num_queries, 4).
            gt_labels (Tensor): GT labels of the batch, image after image,
                (num_gts_total, ).
            gt_bboxes (Tensor): GT boxes, normalized (x1, y1, x2, y2), in
                the same order (num_gts_total, 4).
            num_gts (Sequence[int]): GT count of each image.

        Returns:
            list[tuple[numpy.ndarray]]: Per set, the matched query indexes
            into the set's flattened ``bs * num_queries`` queries and the
            GT indexes into ``gt_labels``, both int64, image after image,
            queries ascending within an image.
        """
        offsets = np.cumsum([0] + list(num_gts))
        empty = (np.zeros(0, np.int64), np.zeros(0, np.int64))
        if offsets[-1] == 0:
            return [empty for _ in cls_scores]
        gt_instances = InstanceData(labels=gt_labels, bboxes=gt_bboxes)
        # each image's columns, padded with its last one (column 0 for an
        # image without GT); the padding is never read
        max_gts = max(num_gts)
        columns = [[
            offset + min(j, count - 1) if count else 0 for j in range(max_gts)
        ] for offset, count in zip(offsets, num_gts)]
        columns = host_to_device(columns, gt_labels.device, torch.long)
        blocks = []
        for scores, boxes in zip(cls_scores, bbox_preds):
            batch_size, num_queries = scores.shape[:2]
            pred_instances = InstanceData(
                scores=scores.flatten(0, 1),
                bboxes=bbox_cxcywh_to_xyxy(boxes.flatten(0, 1)))
            cost = torch.stack([
                match_cost(
                    pred_instances=pred_instances,
                    gt_instances=gt_instances,
                    img_meta=UNIT_IMAGE) for match_cost in self.match_costs
            ]).sum(dim=0).view(batch_size, num_queries, -1)
            blocks.append(
                cost.gather(2, columns[:, None].expand(-1, num_queries,
                                                       -1)).float())
        host = torch.cat([block.flatten() for block in blocks]).cpu().numpy()
        matches, start = [], 0
        for block in blocks:
            batch_size, num_queries, _ = block.shape
            costs = host[start:start + block.numel()].reshape(block.shape)
            start += block.numel()
            queries, gts = [empty[0]], [empty[1]]
            for image, count in enumerate(num_gts):
                if count == 0:
                    continue
                rows, cols = linear_sum_assignment(costs[image, :, :count])
                queries.append(image * num_queries + rows)
                gts.append(offsets[image] + cols)
            matches.append((np.concatenate(queries).astype(np.int64),
                            np.concatenate(gts).astype(np.int64)))
        return matches
