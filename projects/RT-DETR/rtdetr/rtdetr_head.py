"""RT-DETR head: DDP-safe DINO head with the IoU-aware varifocal loss."""
from typing import List, Tuple

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_overlaps
from mmdet.utils import InstanceList, reduce_mean
from mmengine.structures import InstanceData
from torch import Tensor

from mmddp_ext.models.dense_heads import DDPSafeDINOHead
from .rtdetr_varifocal_loss import RTDETRVarifocalLoss


@MODELS.register_module()
class RTDETRHead(DDPSafeDINOHead):
    """:class:`DDPSafeDINOHead` trained with upstream RT-DETR's criterion:
    IoU-aware varifocal classification, L1 and GIoU box losses, all
    normalised by the number of GT boxes averaged over ranks.

    ``cls_branches[i]`` / ``reg_branches[i]`` are upstream's
    ``dec_score_head[i]`` / ``dec_bbox_head[i]``; the extra last pair is
    ``enc_score_head`` / ``enc_bbox_head`` (query selection), as mmdet's
    two-stage heads lay them out.

    ``forward`` replaces ``DeformableDETRHead.forward``: the decoder has
    already applied ``reg_branches`` (once per layer, see
    :class:`RTDETRDecoder`) and passes every layer's boxes as
    ``references``, so only the classification branches run here.

    ``_predict_by_feat_single`` replaces ``DETRHead``'s: the same top-k of
    the flattened sigmoid scores, but boxes are not clamped to the image,
    as upstream's ``RTDETRPostProcessor``.

    Two loss methods are replaced; both share
    :meth:`_losses_from_targets`:

    - ``DETRHead.loss_by_feat_single`` (matching queries of each decoder
      layer and the selected encoder queries),
    - ``DINOHead._loss_dn_single`` (denoising queries),

    Targets come from ``super()``'s ``get_targets`` / ``get_dn_targets``
    (Hungarian matching; dn targets whose dummy group, if any, has zero
    label weights). What differs is the classification term: the score
    target of a matched query is the IoU of its (detached) box with its
    GT, on the GT class; negatives' target is 0 (``loss_cls`` must be an
    :class:`RTDETRVarifocalLoss`). All three terms divide by one
    ``reduce_mean`` of the positive count, clamped to 1, exactly one
    all-reduce per term set whatever the data (mmdet's DETR heads use two),
    so every rank issues the same collectives. An empty dn part gives
    ``pred.sum()`` losses, which keep the graph.

    Accepts the config keys of ``DINOHead``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(self.loss_cls, RTDETRVarifocalLoss):
            raise TypeError(
                'RTDETRHead needs bbox_head.loss_cls.type='
                "'RTDETRVarifocalLoss' (it passes IoU-aware score targets), "
                f'but got {type(self.loss_cls).__name__}. Use '
                "loss_cls=dict(type='RTDETRVarifocalLoss', alpha=0.75, "
                'gamma=2.0, loss_weight=1.0).')

    def forward(self, hidden_states: Tensor,
                references: Tensor) -> Tuple[Tensor, Tensor]:
        """Class scores of every decoder layer run, next to its boxes.

        Args:
            hidden_states (Tensor): (num_run, bs, num_queries, dims).
            references (Tensor): The boxes each layer predicted, normalized
                (cx, cy, w, h), (num_run, bs, num_queries, 4).

        Returns:
            tuple[Tensor]: ``all_layers_cls_scores`` (num_run, bs,
            num_queries, num_classes) and ``all_layers_bbox_preds``
            (``references``).
        """
        scores = torch.stack([
            branch(states)
            for branch, states in zip(self.cls_branches, hidden_states)
        ])
        return scores, references

    def _predict_by_feat_single(self,
                                cls_score: Tensor,
                                bbox_pred: Tensor,
                                img_meta: dict,
                                rescale: bool = True) -> InstanceData:
        """Detections of one image: the ``max_per_img`` best (query,
        class) pairs of the sigmoid scores, boxes scaled to the image and
        not clamped.

        Args:
            cls_score (Tensor): Logits, (num_queries, num_classes).
            bbox_pred (Tensor): Normalized (cx, cy, w, h), (num_queries, 4).
            img_meta (dict): Meta information, with ``img_shape`` and, to
                rescale, ``scale_factor``.
            rescale (bool): Map boxes back to the original image. Defaults
                to True.

        Returns:
            :obj:`InstanceData`: ``bboxes`` (x1, y1, x2, y2), ``scores``,
            ``labels``.
        """
        max_per_img = self.test_cfg.get('max_per_img', len(cls_score))
        scores, indexes = cls_score.sigmoid().flatten().topk(max_per_img)
        boxes = bbox_cxcywh_to_xyxy(bbox_pred[indexes // self.num_classes])
        height, width = img_meta['img_shape']
        boxes = boxes * boxes.new_tensor([width, height, width, height])
        if rescale:
            boxes = boxes / boxes.new_tensor(
                img_meta['scale_factor']).repeat((1, 2))
        return InstanceData(
            bboxes=boxes, scores=scores, labels=indexes % self.num_classes)

    def loss_by_feat_single(self, cls_scores: Tensor, bbox_preds: Tensor,
                            batch_gt_instances: InstanceList,
                            batch_img_metas: List[dict]) -> Tuple[Tensor]:
        """Losses of the matching queries of one layer (or the encoder).

        Replaces ``DETRHead.loss_by_feat_single``: the classification term
        is the IoU-aware varifocal loss; see the class docstring.

        Args:
            cls_scores (Tensor): Logits, (bs, num_queries, num_classes).
            bbox_preds (Tensor): Normalized (cx, cy, w, h) boxes,
                (bs, num_queries, 4).
            batch_gt_instances (list[:obj:`InstanceData`]): GT per image.
            batch_img_metas (list[dict]): Meta information per image.

        Returns:
            tuple[Tensor]: ``loss_cls, loss_bbox, loss_iou``.
        """
        targets = self.get_targets(
            list(cls_scores), list(bbox_preds), batch_gt_instances,
            batch_img_metas)
        return self._losses_from_targets(cls_scores, bbox_preds, targets,
                                         batch_img_metas)

    def _loss_dn_single(self, dn_cls_scores: Tensor, dn_bbox_preds: Tensor,
                        batch_gt_instances: InstanceList,
                        batch_img_metas: List[dict],
                        dn_meta: dict) -> Tuple[Tensor]:
        """Losses of the denoising queries of one decoder layer.

        Replaces ``DDPSafeDINOHead._loss_dn_single`` (and
        ``DINOHead._loss_dn_single``): same targets, IoU-aware varifocal
        classification; see the class docstring.

        Args:
            dn_cls_scores (Tensor): Logits, (bs, num_dn_queries,
                num_classes).
            dn_bbox_preds (Tensor): Normalized (cx, cy, w, h) boxes,
                (bs, num_dn_queries, 4).
            batch_gt_instances (list[:obj:`InstanceData`]): GT per image.
            batch_img_metas (list[dict]): Meta information per image.
            dn_meta (dict): Group collation info from the query generator.

        Returns:
            tuple[Tensor]: ``loss_cls, loss_bbox, loss_iou``.
        """
        targets = self.get_dn_targets(batch_gt_instances, batch_img_metas,
                                      dn_meta)
        return self._losses_from_targets(dn_cls_scores, dn_bbox_preds, targets,
                                         batch_img_metas)

    def _losses_from_targets(self, cls_scores: Tensor, bbox_preds: Tensor,
                             targets: tuple,
                             batch_img_metas: List[dict]) -> Tuple[Tensor]:
        """Varifocal, L1 and GIoU losses from per-image targets."""
        (labels_list, label_weights_list, bbox_targets_list, bbox_weights_list,
         num_total_pos, _) = targets
        labels = torch.cat(labels_list)
        label_weights = torch.cat(label_weights_list)
        bbox_targets = torch.cat(bbox_targets_list)
        bbox_weights = torch.cat(bbox_weights_list)
        scores = cls_scores.reshape(-1, self.cls_out_channels)
        boxes = bbox_preds.reshape(-1, 4)
        # Upstream's num_boxes: the GT count averaged over ranks, >= 1.
        avg_factor = reduce_mean(scores.new_tensor(
            float(num_total_pos))).clamp(min=1)

        one_hot = F.one_hot(labels, self.num_classes + 1)[:, :-1]
        positive = labels < self.num_classes
        ious = scores.new_zeros(labels.shape)
        ious[positive] = bbox_overlaps(
            bbox_cxcywh_to_xyxy(boxes[positive]).detach(),
            bbox_cxcywh_to_xyxy(bbox_targets[positive]),
            is_aligned=True)
        loss_cls = self.loss_cls(
            scores,
            one_hot * ious[:, None],
            weight=label_weights[:, None],
            avg_factor=avg_factor,
            labels=one_hot)

        factors = torch.cat([
            boxes.new_tensor([w, h, w, h]).expand(cls_scores.size(1), 4)
            for h, w in (meta['img_shape'] for meta in batch_img_metas)
        ])
        loss_iou = self.loss_iou(
            bbox_cxcywh_to_xyxy(boxes) * factors,
            bbox_cxcywh_to_xyxy(bbox_targets) * factors,
            bbox_weights,
            avg_factor=avg_factor)
        loss_bbox = self.loss_bbox(
            boxes, bbox_targets, bbox_weights, avg_factor=avg_factor)
        return loss_cls, loss_bbox, loss_iou
