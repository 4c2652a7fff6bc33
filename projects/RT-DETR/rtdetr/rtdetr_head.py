"""RT-DETR head: DDP-safe DINO head with the IoU-aware varifocal loss."""
from typing import Dict, List, NamedTuple, Optional, Tuple, Union

import numpy as np
import torch
from mmdet.registry import MODELS
from mmdet.structures.bbox import (bbox_cxcywh_to_xyxy, bbox_overlaps,
                                   bbox_xyxy_to_cxcywh)
from mmdet.utils import InstanceList, OptInstanceList, reduce_mean
from mmengine.structures import InstanceData
from torch import Tensor

from mmddp_ext.models.dense_heads import DDPSafeDINOHead
from mmddp_ext.models.layers import DUMMY_DN_GROUP_KEY
from .host_to_device import host_to_device
from .rtdetr_varifocal_loss import RTDETRVarifocalLoss

# One set's matches on the host: positive query indexes (into the set's
# flattened bs * num_queries) and their GT indexes (into BatchGT), int64.
Match = Tuple[np.ndarray, np.ndarray]


class BatchGT(NamedTuple):
    """The GT of a batch, image after image, on the device.

    Attributes:
        labels (Tensor): Classes, (num_gts, ).
        corners (Tensor): Boxes divided by their image's size, (x1, y1,
            x2, y2), (num_gts, 4).
        boxes (Tensor): The same as (cx, cy, w, h): the box targets.
        target_corners (Tensor): ``boxes`` back in (x1, y1, x2, y2), as
            the IoU terms see the targets.
        scales (Tensor): Each box's image (w, h, w, h), (num_gts, 4).
        counts (list[int]): GT count of each image.
    """
    labels: Tensor
    corners: Tensor
    boxes: Tensor
    target_corners: Tensor
    scales: Tensor
    counts: List[int]


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

    The losses are upstream's (``RTDETRCriterionv2``): for each decoder
    layer's matching queries, the selected encoder queries and each
    layer's dn queries, a varifocal classification term whose score
    target for a matched query is the IoU of its (detached) box with its
    GT, on the GT class, and 0 elsewhere (``loss_cls`` must be an
    :class:`RTDETRVarifocalLoss`), and L1 and GIoU terms over the matched
    queries. All three divide by one ``reduce_mean`` of the positive
    count, clamped to 1: exactly one all-reduce per set whatever the data
    (mmdet's DETR heads use two), so every rank issues the same
    collectives. Matches are mmdet's: the Hungarian assignment of
    ``train_cfg.assigner`` for matching queries, and
    ``DINOHead._get_dn_targets_single``'s fixed slots for dn queries, the
    dummy dn group of a GT-less batch having zero classification weight
    (as ``DDPSafeDINOHead``). A set without positives gets
    ``boxes.sum() * 0`` box terms, which keep the graph.

    ``loss_by_feat`` replaces ``DINOHead.loss_by_feat`` and everything it
    runs per layer and per image (``loss_by_feat_single``,
    ``get_targets``, ``loss_dn``, ``get_dn_targets``): the same keys and
    values, up to float summation order, computed for the whole batch,
    because the per-image path made the host wait for the device several
    times per image and layer (the cost matrix's copy to the host,
    ``nonzero``, ``unique``, small host-to-device copies, the box losses'
    ``torch.any(weight > 0)``) and spent its time in Python; upstream
    matches and computes each loss over the batch at once. Here the GT of
    the batch is gathered once (:class:`BatchGT`), every set is matched
    in one call of the assigner's ``assign_batch``
    (:class:`BatchedHungarianAssigner`: one device-to-host copy for all
    layers), the dn slots are computed once for all layers, all match
    indexes travel to the device in one non-blocking copy, and each set's
    losses index its positives directly. An assigner without
    ``assign_batch`` is run per image with its ``assign``, as
    ``DETRHead.get_targets`` runs it. ``loss_by_feat_single`` and
    ``_loss_dn_single`` (one set) remain, on the same code.

    Accepts the config keys of ``DINOHead``.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

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
        boxes = boxes * host_to_device([width, height, width, height],
                                       boxes.device, boxes.dtype)
        if rescale:
            boxes = boxes / host_to_device(img_meta['scale_factor'],
                                           boxes.device, boxes.dtype).repeat(
                                               (1, 2))
        return InstanceData(
            bboxes=boxes, scores=scores, labels=indexes % self.num_classes)

    def loss_by_feat(
        self,
        all_layers_cls_scores: Tensor,
        all_layers_bbox_preds: Tensor,
        enc_cls_scores: Optional[Tensor],
        enc_bbox_preds: Optional[Tensor],
        batch_gt_instances: InstanceList,
        batch_img_metas: List[dict],
        dn_meta: Dict[str, Union[int, bool]],
        batch_gt_instances_ignore: OptInstanceList = None
    ) -> Dict[str, Tensor]:
        """All losses of a batch: every decoder layer's matching and dn
        queries and the selected encoder queries.

        Replaces ``DINOHead.loss_by_feat`` (and the ``DETRHead``
        ``loss_by_feat`` / ``loss_by_feat_single`` / ``get_targets`` and
        ``DINOHead.loss_dn`` / ``get_dn_targets`` it runs per layer and
        per image): the same loss keys and values, computed for the whole
        batch; see the class docstring.

        Args:
            all_layers_cls_scores (Tensor): Logits of every decoder layer,
                (num_layers, bs, num_dn + num_queries, num_classes).
            all_layers_bbox_preds (Tensor): Normalized (cx, cy, w, h)
                boxes, (num_layers, bs, num_dn + num_queries, 4).
            enc_cls_scores (Tensor, optional): Logits of the selected
                encoder queries, (bs, num_queries, num_classes).
            enc_bbox_preds (Tensor, optional): Their boxes.
            batch_gt_instances (list[:obj:`InstanceData`]): GT per image.
            batch_img_metas (list[dict]): Meta information per image.
            dn_meta (dict): Group collation info from the query generator.
            batch_gt_instances_ignore (list, optional): Must be None.

        Returns:
            dict[str, Tensor]: ``loss_*`` (last layer), ``d{i}.loss_*``,
            ``enc_loss_*``, ``dn_loss_*`` and ``d{i}.dn_loss_*`` for
            ``*`` in ``cls``, ``bbox``, ``iou``, in ``DINOHead``'s order.
        """
        if batch_gt_instances_ignore is not None:
            raise ValueError(
                'RTDETRHead does not support batch_gt_instances_ignore, but '
                'got a value. Drop ignored boxes in the dataset pipeline.')
        (layers_cls, layers_boxes, dn_cls,
         dn_boxes) = self.split_outputs(all_layers_cls_scores,
                                        all_layers_bbox_preds, dn_meta)
        gt = self._batch_gt(batch_gt_instances, batch_img_metas,
                            all_layers_cls_scores.device)
        cls_sets, box_sets = list(layers_cls), list(layers_boxes)
        if enc_cls_scores is not None:
            cls_sets.append(enc_cls_scores)
            box_sets.append(enc_bbox_preds)
        matches = self._match(cls_sets, box_sets, gt, batch_gt_instances,
                              batch_img_metas)
        if dn_cls is not None:
            matches.append(self._dn_match(gt.counts, dn_meta))
        indices = self._indices_to_device(matches, gt.labels.device)
        set_losses = [
            self._set_losses(scores, boxes, pair, gt)
            for scores, boxes, pair in zip(cls_sets, box_sets, indices)
        ]
        num_layers = len(layers_cls)
        losses = _named(set_losses[num_layers - 1], '')
        for layer in range(num_layers - 1):
            losses.update(_named(set_losses[layer], f'd{layer}.'))
        if enc_cls_scores is not None:
            losses.update(_named(set_losses[num_layers], 'enc_'))
        if dn_cls is not None:
            label_weights = self._dn_label_weights(gt.counts, dn_meta)
            dn_losses = [
                self._set_losses(scores, boxes, indices[-1], gt, label_weights)
                for scores, boxes in zip(dn_cls, dn_boxes)
            ]
            losses.update(_named(dn_losses[-1], 'dn_'))
            for layer in range(num_layers - 1):
                losses.update(_named(dn_losses[layer], f'd{layer}.dn_'))
        return losses

    def loss_by_feat_single(self, cls_scores: Tensor, bbox_preds: Tensor,
                            batch_gt_instances: InstanceList,
                            batch_img_metas: List[dict]) -> Tuple[Tensor]:
        """Losses of the matching queries of one layer (or the encoder).

        Replaces ``DETRHead.loss_by_feat_single``: the terms
        :meth:`loss_by_feat` computes for one set; see the class
        docstring.

        Args:
            cls_scores (Tensor): Logits, (bs, num_queries, num_classes).
            bbox_preds (Tensor): Normalized (cx, cy, w, h) boxes,
                (bs, num_queries, 4).
            batch_gt_instances (list[:obj:`InstanceData`]): GT per image.
            batch_img_metas (list[dict]): Meta information per image.

        Returns:
            tuple[Tensor]: ``loss_cls, loss_bbox, loss_iou``.
        """
        gt = self._batch_gt(batch_gt_instances, batch_img_metas,
                            cls_scores.device)
        matches = self._match([cls_scores], [bbox_preds], gt,
                              batch_gt_instances, batch_img_metas)
        indices = self._indices_to_device(matches, gt.labels.device)
        return self._set_losses(cls_scores, bbox_preds, indices[0], gt)

    def _loss_dn_single(self, dn_cls_scores: Tensor, dn_bbox_preds: Tensor,
                        batch_gt_instances: InstanceList,
                        batch_img_metas: List[dict],
                        dn_meta: dict) -> Tuple[Tensor]:
        """Losses of the denoising queries of one decoder layer.

        Replaces ``DDPSafeDINOHead._loss_dn_single`` (and
        ``DINOHead._loss_dn_single``): the terms :meth:`loss_by_feat`
        computes for one layer's dn queries; see the class docstring.

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
        gt = self._batch_gt(batch_gt_instances, batch_img_metas,
                            dn_cls_scores.device)
        indices = self._indices_to_device([self._dn_match(gt.counts, dn_meta)],
                                          gt.labels.device)
        return self._set_losses(dn_cls_scores, dn_bbox_preds, indices[0], gt,
                                self._dn_label_weights(gt.counts, dn_meta))

    @staticmethod
    def _batch_gt(batch_gt_instances: InstanceList,
                  batch_img_metas: List[dict], device) -> BatchGT:
        """The batch's GT, image after image (see :class:`BatchGT`); the
        image sizes travel to the device in one non-blocking copy."""
        counts = [len(gt) for gt in batch_gt_instances]
        bboxes = torch.cat([gt.bboxes for gt in batch_gt_instances])
        sizes = []
        for img_meta, count in zip(batch_img_metas, counts):
            height, width = img_meta['img_shape']
            sizes += [[width, height, width, height]] * count
        scales = host_to_device(sizes, device, bboxes.dtype).reshape(-1, 4)
        # mmdet's order: divide by the image size, then convert
        corners = bboxes.to(device) / scales
        boxes = bbox_xyxy_to_cxcywh(corners)
        return BatchGT(
            labels=torch.cat([gt.labels
                              for gt in batch_gt_instances]).to(device),
            corners=corners,
            boxes=boxes,
            target_corners=bbox_cxcywh_to_xyxy(boxes),
            scales=scales,
            counts=counts)

    def _match(self, cls_sets: List[Tensor], box_sets: List[Tensor],
               gt: BatchGT, batch_gt_instances: InstanceList,
               batch_img_metas: List[dict]) -> List[Match]:
        """Hungarian matches of every set: one batched call when the
        assigner has ``assign_batch`` (:class:`BatchedHungarianAssigner`),
        else ``assign`` per image and set, as ``DETRHead.get_targets``;
        on float32 predictions also under autocast
        (``_matching_inputs``)."""
        inputs = [
            self._matching_inputs(scores.detach(), boxes.detach())
            for scores, boxes in zip(cls_sets, box_sets)
        ]
        cls_sets = [scores for scores, _ in inputs]
        box_sets = [boxes for _, boxes in inputs]
        if hasattr(self.assigner, 'assign_batch'):
            return self.assigner.assign_batch(cls_sets, box_sets, gt.labels,
                                              gt.corners, gt.counts)
        return [
            self._match_each_image(scores, boxes, batch_gt_instances,
                                   batch_img_metas)
            for scores, boxes in zip(cls_sets, box_sets)
        ]

    def _match_each_image(self, cls_scores: Tensor, bbox_preds: Tensor,
                          batch_gt_instances: InstanceList,
                          batch_img_metas: List[dict]) -> Match:
        """``assigner.assign`` on each image, with the predictions in
        pixels as ``DETRHead._get_targets_single`` passes them."""
        queries, gts, offset = [], [], 0
        for image, (scores, boxes, gt_instances, img_meta) in enumerate(
                zip(cls_scores, bbox_preds, batch_gt_instances,
                    batch_img_metas)):
            height, width = img_meta['img_shape']
            pixels = bbox_cxcywh_to_xyxy(boxes) * boxes.new_tensor(
                [width, height, width, height])
            result = self.assigner.assign(
                pred_instances=InstanceData(scores=scores, bboxes=pixels),
                gt_instances=gt_instances,
                img_meta=img_meta)
            gt_inds = result.gt_inds.cpu().numpy()
            rows = np.flatnonzero(gt_inds > 0)
            queries.append(image * len(scores) + rows)
            gts.append(offset + gt_inds[rows] - 1)
            offset += len(gt_instances)
        return (np.concatenate(queries).astype(np.int64),
                np.concatenate(gts).astype(np.int64))

    @staticmethod
    def _dn_match(counts: List[int], dn_meta: dict) -> Match:
        """The dn positives of ``DINOHead._get_dn_targets_single``: in
        group ``g`` of each image, query ``g * group_size + t`` for its
        GT ``t``; none in a dummy group (no GT)."""
        num_groups = dn_meta['num_denoising_groups']
        num_queries = dn_meta['num_denoising_queries']
        group_size = int(num_queries / num_groups)
        empty = np.zeros(0, np.int64)
        queries, gts, offset = [empty], [empty], 0
        for image, count in enumerate(counts):
            targets = np.arange(count, dtype=np.int64)
            slots = (
                np.arange(num_groups, dtype=np.int64)[:, None] * group_size +
                targets)
            queries.append(image * num_queries + slots.ravel())
            gts.append(offset + np.tile(targets, num_groups))
            offset += count
        return np.concatenate(queries), np.concatenate(gts)

    @staticmethod
    def _dn_label_weights(counts: List[int], dn_meta: dict) -> List[float]:
        """Classification weight of each image's dn queries: 0 in the
        dummy group of a GT-less batch (as ``DDPSafeDINOHead``), else 1,
        padding queries of an image without GT included (as
        ``DINOHead._get_dn_targets_single``)."""
        weight = 0.0 if dn_meta.get(DUMMY_DN_GROUP_KEY, False) else 1.0
        return [weight] * len(counts)

    @staticmethod
    def _indices_to_device(matches: List[Match],
                           device) -> List[Tuple[Tensor, Tensor]]:
        """Every set's (query, GT) indexes on ``device``, in one
        non-blocking copy."""
        sizes = [len(queries) for queries, _ in matches]
        both = host_to_device(
            np.concatenate([np.stack(pair) for pair in matches], axis=1),
            device)
        return [(pair[0], pair[1]) for pair in both.split(sizes, dim=1)]

    def _set_losses(
            self,
            cls_scores: Tensor,
            bbox_preds: Tensor,
            indices: Tuple[Tensor, Tensor],
            gt: BatchGT,
            label_weights: Optional[List[float]] = None) -> Tuple[Tensor]:
        """Varifocal, L1 and GIoU losses of one set of queries.

        Args:
            cls_scores (Tensor): Logits, (bs, num_queries, num_classes).
            bbox_preds (Tensor): Normalized (cx, cy, w, h) boxes,
                (bs, num_queries, 4).
            indices (tuple[Tensor]): Positive queries (into the flattened
                ``bs * num_queries``) and their GT (into ``gt``).
            gt (:class:`BatchGT`): The batch's GT.
            label_weights (list[float], optional): Weight of each image's
                classification terms. Defaults to None, i.e. 1.

        Returns:
            tuple[Tensor]: ``loss_cls, loss_bbox, loss_iou``.
        """
        queries, gts = indices
        scores = cls_scores.reshape(-1, self.cls_out_channels)
        boxes = bbox_preds.reshape(-1, 4)
        # Upstream's num_boxes: the GT count averaged over ranks, >= 1.
        avg_factor = reduce_mean(scores.new_full(
            (), float(len(queries)))).clamp(min=1)
        pos_boxes, pos_targets = boxes[queries], gt.boxes[gts]
        pos_corners = bbox_cxcywh_to_xyxy(pos_boxes)
        target_corners = gt.target_corners[gts]
        one_hot = torch.zeros_like(scores)
        one_hot[queries, gt.labels[gts]] = 1
        ious = scores.new_zeros(len(scores))
        ious[queries] = bbox_overlaps(
            pos_corners.detach(), target_corners,
            is_aligned=True).to(ious.dtype)
        loss_cls = self.loss_cls(
            scores,
            one_hot * ious[:, None],
            weight=self._query_weights(cls_scores, label_weights,
                                       gt.boxes.dtype),
            avg_factor=avg_factor,
            labels=one_hot)
        if len(queries) == 0:
            # 0 in the graph, as mmdet's box losses give all-zero weights
            no_boxes = boxes.sum() * 0
            return loss_cls, no_boxes, no_boxes
        scales = gt.scales[gts]
        loss_iou = self.loss_iou(
            pos_corners * scales,
            target_corners * scales,
            avg_factor=avg_factor)
        loss_bbox = self.loss_bbox(
            pos_boxes, pos_targets, avg_factor=avg_factor)
        return loss_cls, loss_bbox, loss_iou

    @staticmethod
    def _query_weights(cls_scores: Tensor,
                       image_weights: Optional[List[float]],
                       dtype: torch.dtype) -> Tensor:
        """Per-query weights (bs * num_queries, 1) from per-image ones,
        made on the device when all are equal."""
        batch_size, num_queries = cls_scores.shape[:2]
        if image_weights is None or len(set(image_weights)) == 1:
            value = 1.0 if image_weights is None else image_weights[0]
            return torch.full((batch_size * num_queries, 1),
                              value,
                              dtype=dtype,
                              device=cls_scores.device)
        weights = host_to_device(image_weights, cls_scores.device, dtype)
        return weights[:, None].expand(batch_size, num_queries).reshape(-1, 1)


def _named(terms: Tuple[Tensor], prefix: str) -> Dict[str, Tensor]:
    """``{prefix}loss_cls``, ``{prefix}loss_bbox``, ``{prefix}loss_iou``."""
    return {
        f'{prefix}loss_{name}': term
        for name, term in zip(('cls', 'bbox', 'iou'), terms)
    }
