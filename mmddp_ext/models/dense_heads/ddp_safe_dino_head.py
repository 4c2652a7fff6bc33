"""DINO head whose denoising loss is the same on every rank, GT or not."""
from typing import Dict, List, Tuple, Union

import torch
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS
from mmdet.utils import InstanceList
from mmengine.structures import InstanceData
from torch import Tensor

from ...utils.precision import full_precision
from ..layers.ddp_safe_cdn_query_generator import DUMMY_DN_GROUP_KEY

# Group collation info from the query generator (ints and one bool).
DnMeta = Dict[str, Union[int, bool]]


@MODELS.register_module()
class DDPSafeDINOHead(DINOHead):
    """``DINOHead`` whose denoising loss stays in the graph and gives the
    dummy dn group of ``DDPSafeCdnQueryGenerator`` exactly zero weight.

    Three upstream methods are extended, all through ``super()``:

    - ``_get_dn_targets_single``: when ``dn_meta['dummy_dn_group']`` is
      True, the label weights are zero as well (upstream trains every
      query of a GT-less image as background with weight 1, so the dummy
      would act as a negative). Box weights and the positive/negative
      counts are already zero there, so the dummy adds nothing to the
      classification, box or IoU terms or to their average factors.
    - ``_loss_dn_single``: when the dn part is empty (stock
      ``CdnQueryGenerator`` on a GT-less batch), upstream returns a
      detached ``torch.zeros(1)`` as the classification loss; here it is
      ``dn_cls_scores.sum()`` (0, connected to the graph), so the loss
      reaches the decoder on every rank.
    - ``_get_targets_single``: the assigner matches float32 predictions
      (:meth:`_matching_inputs`), also under autocast.

    Every all-reduce of the upstream loss (``reduce_mean`` of the average
    factors in ``loss_by_feat_single`` and ``_loss_dn_single``) depends
    only on the config, never on the data, so each rank issues the same
    collectives in the same order; these overrides add none and skip none.
    With GT in the batch and ``dummy_dn_group`` False, the arithmetic is
    upstream's, bit for bit.

    Accepts the same config keys as ``DINOHead``.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def _matching_inputs(self, cls_score: Tensor,
                         bbox_pred: Tensor) -> Tuple[Tensor, Tensor]:
        """The class logits and boxes the assigner matches, in float32.

        Under autocast (an AMP recipe) the head's layers give float16, and
        the match costs need full precision: ``FocalLossCost`` adds its
        ``eps`` (1e-12, 1e-8) to a sigmoid that float16 rounds to 0 or 1
        beyond logits of about -17 or +8.3, and the eps itself rounds to 0,
        so the log is -inf and scipy's ``linear_sum_assignment`` raises
        "matrix contains invalid numeric entries"; boxes scaled to pixels
        have areas beyond float16's 65504 from 256 x 256 px on (inf and
        NaN IoU costs); and a cost difference below float16's resolution
        (1e-3 relative) decides the match. Heads that match in their own
        way (RT-DETR's batched matching, D-FINE's) call this too.

        Args:
            cls_score (Tensor): Class logits, any shape.
            bbox_pred (Tensor): Normalized (cx, cy, w, h) boxes.

        Returns:
            tuple[Tensor]: Both in float32 (unchanged when already full
            precision).
        """
        return full_precision(cls_score), full_precision(bbox_pred)

    def _get_targets_single(self, cls_score: Tensor, bbox_pred: Tensor,
                            gt_instances: InstanceData,
                            img_meta: dict) -> tuple:
        """``DETRHead._get_targets_single`` on float32 predictions (see
        :meth:`_matching_inputs`); it only matches and builds targets, so
        nothing differs outside autocast.

        Returns:
            tuple: ``labels, label_weights, bbox_targets, bbox_weights,
            pos_inds, neg_inds`` as in ``DETRHead._get_targets_single``.
        """
        cls_score, bbox_pred = self._matching_inputs(cls_score, bbox_pred)
        return super()._get_targets_single(cls_score, bbox_pred, gt_instances,
                                           img_meta)

    def _get_dn_targets_single(self, gt_instances: InstanceData,
                               img_meta: dict, dn_meta: DnMeta) -> tuple:
        """Dn targets of one image; zero label weights for the dummy group.

        Args:
            gt_instances (:obj:`InstanceData`): GT of the image, with
                ``bboxes`` and ``labels``.
            img_meta (dict): Meta information of the image.
            dn_meta (dict): Group collation info from the query generator;
                ``dummy_dn_group`` marks a dummy group.

        Returns:
            tuple: ``labels, label_weights, bbox_targets, bbox_weights,
            pos_inds, neg_inds`` as in ``DINOHead._get_dn_targets_single``.
        """
        targets = super()._get_dn_targets_single(gt_instances, img_meta,
                                                 dn_meta)
        if not dn_meta.get(DUMMY_DN_GROUP_KEY, False):
            return targets
        labels, label_weights, *rest = targets
        return (labels, torch.zeros_like(label_weights), *rest)

    def _loss_dn_single(self, dn_cls_scores: Tensor, dn_bbox_preds: Tensor,
                        batch_gt_instances: InstanceList,
                        batch_img_metas: List[dict],
                        dn_meta: DnMeta) -> Tuple[Tensor]:
        """Dn loss of one decoder layer, connected to the graph when empty.

        Args:
            dn_cls_scores (Tensor): Dn classification scores, shape
                (bs, num_denoising_queries, cls_out_channels).
            dn_bbox_preds (Tensor): Dn boxes, normalized (cx, cy, w, h),
                shape (bs, num_denoising_queries, 4).
            batch_gt_instances (list[:obj:`InstanceData`]): GT per image.
            batch_img_metas (list[dict]): Meta information per image.
            dn_meta (dict): Group collation info from the query generator.

        Returns:
            tuple[Tensor]: ``loss_cls, loss_bbox, loss_iou``.
        """
        loss_cls, loss_bbox, loss_iou = super()._loss_dn_single(
            dn_cls_scores, dn_bbox_preds, batch_gt_instances, batch_img_metas,
            dn_meta)
        if dn_cls_scores.numel() == 0:
            loss_cls = dn_cls_scores.sum()
        return loss_cls, loss_bbox, loss_iou
