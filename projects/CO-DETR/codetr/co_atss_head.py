"""ATSS auxiliary head that also reports its positive anchors."""
from typing import List, Optional

import torch
from mmdet.models.dense_heads import ATSSHead
from mmdet.registry import MODELS
from mmdet.utils import InstanceList, OptInstanceList
from torch import Tensor


@MODELS.register_module()
class CoATSSHead(ATSSHead):
    """``ATSSHead`` whose loss dict also carries ``pos_coords``: per image,
    every anchor with its assigned label and box target, from which the
    CO-DINO query head builds its extra positive queries.

    The loss terms, their targets and their ``reduce_mean`` calls are
    ``ATSSHead``'s, unchanged (upstream CO-DETR copies that code; here it
    is called through ``super()``). Accepts the config keys of
    ``ATSSHead``.
    """

    def get_targets(self,
                    anchor_list: List[List[Tensor]],
                    valid_flag_list: List[List[Tensor]],
                    batch_gt_instances: InstanceList,
                    batch_img_metas: List[dict],
                    batch_gt_instances_ignore: OptInstanceList = None,
                    unmap_outputs: bool = True) -> tuple:
        """``ATSSHead.get_targets``, also keeping each image's anchors,
        labels and box targets (all levels) for :meth:`loss_by_feat`."""
        targets = super().get_targets(
            anchor_list,
            valid_flag_list,
            batch_gt_instances,
            batch_img_metas,
            batch_gt_instances_ignore=batch_gt_instances_ignore,
            unmap_outputs=unmap_outputs)
        anchors, labels, _, bbox_targets = targets[:4]
        num_imgs = len(batch_img_metas)
        self._pos_coords = (
            [_per_image(anchors, i) for i in range(num_imgs)],
            [_per_image(labels, i) for i in range(num_imgs)],
            [_per_image(bbox_targets, i) for i in range(num_imgs)],
        )
        return targets

    def loss_by_feat(
            self,
            cls_scores: List[Tensor],
            bbox_preds: List[Tensor],
            centernesses: List[Tensor],
            batch_gt_instances: InstanceList,
            batch_img_metas: List[dict],
            batch_gt_instances_ignore: Optional[InstanceList] = None) -> dict:
        """``ATSSHead.loss_by_feat`` plus ``pos_coords`` = (anchors,
        labels, box targets, 'atss'), each a per-image list."""
        losses = super().loss_by_feat(cls_scores, bbox_preds, centernesses,
                                      batch_gt_instances, batch_img_metas,
                                      batch_gt_instances_ignore)
        pos_coords, self._pos_coords = self._pos_coords, None
        losses['pos_coords'] = (*pos_coords, 'atss')
        return losses


def _per_image(per_level: List[Tensor], index: int) -> Tensor:
    """Image ``index`` of (num_imgs, n_level, ...) tensors, levels joined."""
    return torch.cat([level[index] for level in per_level])
