"""CO-DINO's query head: DINO with DDP-safe denoising plus the auxiliary
positive-query groups built from the ATSS and Faster R-CNN branches."""
import copy
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from mmcv.ops import batched_nms
from mmdet.models.layers.transformer import inverse_sigmoid
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import (bbox_cxcywh_to_xyxy, bbox_overlaps,
                                   bbox_xyxy_to_cxcywh)
from mmdet.utils import InstanceList, reduce_mean
from mmengine.structures import InstanceData
from torch import Tensor

from mmddp_ext.models import DDPSafeCdnQueryGenerator, DDPSafeDINOHead

# Upstream pads every image's auxiliary query group to at least this many.
MIN_AUX_QUERIES = 9


@MODELS.register_module()
class CoDINOHead(DDPSafeDINOHead):
    """CO-DINO query head on the DDP-safe DINO head.

    Same parameters as upstream CO-DETR's ``CoDINOHead`` (``transformer``,
    ``cls_branches`` / ``reg_branches`` with ``num_decoder_layers + 1``
    entries, ``downsample``, ``dn_generator.label_embedding``), so
    upstream checkpoints load. What differs, and why:

    - The dn queries come from :class:`DDPSafeCdnQueryGenerator`, and the
      loss is ``DDPSafeDINOHead``'s: a rank without GT trains a
      zero-weighted dummy group, never a different graph.
    - ``loss_single_aux`` has no ``except`` path: upstream returns early
      there and skips two ``reduce_mean`` calls, so ranks issue different
      collectives and DDP hangs. Here the auxiliary targets always have
      shape (bs, n) and every all-reduce runs on every rank.
    - Auxiliary targets are built on the tensors' device (upstream calls
      ``.cuda()``), so the head runs on CPU.
    - With ``use_zero_padding`` the padding queries are masked in the
      decoder's self-attention (upstream builds the mask, then passes
      None); each padding query still attends to itself, so no row is
      fully masked.

    Args:
        num_query (int): Number of matching queries. Defaults to 900.
        transformer (dict): Config of ``CoDinoTransformer``. Required.
        in_channels (int): Accepted for upstream config compatibility.
            Defaults to 2048.
        max_pos_coords (int): Most auxiliary positive queries per image.
            Defaults to 300.
        dn_cfg (dict): Denoising config (``label_noise_scale``,
            ``box_noise_scale``, ``group_cfg``). Required.
        use_zero_padding (bool): Pad auxiliary query groups with
            zero-weighted empty queries instead of random negatives.
            Defaults to False.
        positional_encoding (dict): Config of the sine positional
            encoding, ``num_feats`` must be half the transformer's
            ``embed_dims``. Defaults to dict(type='SinePositionalEncoding',
            num_feats=128, normalize=True).
        as_two_stage (bool): Accepted for upstream config compatibility;
            must be True. Defaults to True.
        **kwargs: Forwarded to ``DINOHead`` (``num_classes``,
            ``sync_cls_avg_factor``, losses, ``train_cfg``, ``test_cfg``).
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self,
                 *args,
                 num_query: int = 900,
                 transformer: Optional[dict] = None,
                 in_channels: int = 2048,
                 max_pos_coords: int = 300,
                 dn_cfg: Optional[dict] = None,
                 use_zero_padding: bool = False,
                 positional_encoding: dict = dict(
                     type='SinePositionalEncoding',
                     num_feats=128,
                     normalize=True),
                 **kwargs) -> None:
        for key, value in (('transformer', transformer), ('dn_cfg', dn_cfg)):
            if not isinstance(value, dict):
                raise TypeError(
                    f'CoDINOHead: query_head.{key} must be a dict, but got '
                    f'{value!r}. Copy it from configs/co_dino_ext.py.')
        transformer = copy.deepcopy(transformer)
        transformer['two_stage_num_proposals'] = num_query
        self.transformer_cfg = transformer
        self.num_query = num_query
        self.in_channels = in_channels
        self.max_pos_coords = max_pos_coords
        self.use_zero_padding = use_zero_padding
        if not kwargs.pop('as_two_stage', True):
            raise ValueError(
                'CoDINOHead: query_head.as_two_stage must be True (DINO '
                'selects its queries from the encoder), but got False. '
                'Remove the key.')
        super().__init__(*args, as_two_stage=True, **kwargs)
        self.positional_encoding = MODELS.build(positional_encoding)
        if self.positional_encoding.num_feats * 2 != self.embed_dims:
            raise ValueError(
                'CoDINOHead: positional_encoding.num_feats must be half of '
                f'the transformer embed_dims ({self.embed_dims}), but got '
                f'{self.positional_encoding.num_feats}. Set it to '
                f'{self.embed_dims // 2}.')
        self.dn_generator = DDPSafeCdnQueryGenerator(
            **dn_cfg,
            num_classes=self.num_classes,
            embed_dims=self.embed_dims,
            num_matching_queries=num_query)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args,
                              **kwargs) -> None:
        """Also accept the original Sense-X/Co-DETR checkpoints, which keep
        the dn label embedding at ``query_head.label_embedding`` (mmdet's
        port, like this one, at ``query_head.dn_generator.label_embedding``).
        """
        legacy = prefix + 'label_embedding.weight'
        if legacy in state_dict:
            state_dict[prefix + 'dn_generator.label_embedding.weight'] = \
                state_dict.pop(legacy)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _init_layers(self) -> None:
        """Build the transformer and the prediction branches.

        Replaces ``DeformableDETRHead._init_layers``: the embedding width
        comes from the transformer, there is one branch per decoder layer
        plus one for the encoder proposals, and the ``downsample`` layer
        that adds the extra feature level for the auxiliary heads.
        """
        self.transformer = MODELS.build(self.transformer_cfg)
        self.embed_dims = self.transformer.embed_dims
        num_branches = self.transformer.decoder.num_layers + 1
        self.num_pred_layer = num_branches
        self.share_pred_layer = False
        super()._init_layers()
        self.downsample = nn.Sequential(
            nn.Conv2d(
                self.embed_dims,
                self.embed_dims,
                kernel_size=3,
                stride=2,
                padding=1), nn.GroupNorm(32, self.embed_dims))

    def init_weights(self) -> None:
        """``DeformableDETRHead.init_weights`` plus the transformer's."""
        super().init_weights()
        self.transformer.init_weights()

    @staticmethod
    def _padding_masks(mlvl_feats: Sequence[Tensor],
                       batch_img_metas: List[dict]) -> List[Tensor]:
        """Per-level padding masks, True on padding."""
        batch_size = mlvl_feats[0].size(0)
        input_h, input_w = batch_img_metas[0]['batch_input_shape']
        img_masks = mlvl_feats[0].new_ones((batch_size, input_h, input_w))
        for index, meta in enumerate(batch_img_metas):
            img_h, img_w = meta['img_shape']
            img_masks[index, :img_h, :img_w] = 0
        return [
            F.interpolate(img_masks[None],
                          size=feat.shape[-2:]).to(torch.bool).squeeze(0)
            for feat in mlvl_feats
        ]

    def _masks_and_positions(
            self, mlvl_feats: Sequence[Tensor],
            batch_img_metas: List[dict]) -> Tuple[List[Tensor], List[Tensor]]:
        """Per-level padding masks (True on padding) and sine positions."""
        masks = self._padding_masks(mlvl_feats, batch_img_metas)
        return masks, [self.positional_encoding(mask) for mask in masks]

    def _predictions(self, states: Tensor,
                     references: Tensor) -> Tuple[Tensor, Tensor]:
        """Class scores and boxes of every decoder layer."""
        classes, coords = [], []
        for layer, hidden in enumerate(states.permute(0, 2, 1, 3)):
            reference = inverse_sigmoid(references[layer], eps=1e-3)
            classes.append(self.cls_branches[layer](hidden))
            coords.append(
                (self.reg_branches[layer](hidden) + reference).sigmoid())
        return torch.stack(classes), torch.stack(coords)

    def forward(self,
                mlvl_feats: Sequence[Tensor],
                batch_img_metas: List[dict],
                dn_label_query: Optional[Tensor] = None,
                dn_bbox_query: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None) -> Tuple:
        """Run the transformer and the prediction branches.

        Replaces ``DINOHead.forward`` (which takes decoder outputs): this
        head owns the transformer, as upstream's does.

        Returns:
            tuple: class scores (num_layers, bs, nq, cls), boxes
            (num_layers, bs, nq, 4), top-k encoder scores and boxes, and
            the encoder output as feature maps (one per level plus a
            downsampled one) for the auxiliary heads.
        """
        masks, positions = self._masks_and_positions(mlvl_feats,
                                                     batch_img_metas)
        states, references, topk_score, topk_anchor, memory = \
            self.transformer(mlvl_feats, masks, positions,
                             self.reg_branches, self.cls_branches,
                             dn_label_query, dn_bbox_query, attn_mask)
        feature_maps, start = [], 0
        for feat in mlvl_feats:
            batch_size, channels, height, width = feat.shape
            end = start + height * width
            # Contiguous, as upstream: mmcv's CPU RoIAlign indexes the raw
            # buffer as NCHW and would read other positions of a view.
            level = memory[:, start:end].permute(0, 2, 1).contiguous()
            feature_maps.append(
                level.reshape(batch_size, channels, height, width))
            start = end
        feature_maps.append(self.downsample(feature_maps[-1]))
        all_classes, all_coords = self._predictions(states, references)
        return all_classes, all_coords, topk_score, topk_anchor, feature_maps

    def loss(self, x: Sequence[Tensor],
             batch_data_samples: SampleList) -> Tuple[Dict, List[Tensor]]:
        """DINO losses (matching, dn, encoder) and the encoder feature maps.

        Replaces ``DINOHead.loss``: the head runs its own transformer and
        also returns the encoder output for the auxiliary heads.
        """
        batch_gt_instances = [s.gt_instances for s in batch_data_samples]
        batch_img_metas = [s.metainfo for s in batch_data_samples]
        dn_label_query, dn_bbox_query, attn_mask, dn_meta = \
            self.dn_generator(batch_data_samples)
        *outs, feature_maps = self(x, batch_img_metas, dn_label_query,
                                   dn_bbox_query, attn_mask)
        losses = self.loss_by_feat(*outs, batch_gt_instances, batch_img_metas,
                                   dn_meta)
        return losses, feature_maps

    def predict(self,
                feats: Sequence[Tensor],
                batch_data_samples: SampleList,
                rescale: bool = True) -> InstanceList:
        """Detections of the last decoder layer.

        Replaces ``DETRHead.predict`` (which takes decoder outputs).
        """
        batch_img_metas = [s.metainfo for s in batch_data_samples]
        all_classes, all_coords, *_ = self(feats, batch_img_metas)
        return self.predict_by_feat(
            all_classes, all_coords, batch_img_metas, rescale=rescale)

    def _predict_by_feat_single(self,
                                cls_score: Tensor,
                                bbox_pred: Tensor,
                                img_meta: dict,
                                rescale: bool = True) -> InstanceData:
        """``DETRHead._predict_by_feat_single`` plus upstream CO-DINO's
        optional ``test_cfg.score_thr`` and ``test_cfg.nms``."""
        results = super()._predict_by_feat_single(cls_score, bbox_pred,
                                                  img_meta, rescale)
        score_thr = self.test_cfg.get('score_thr', 0)
        if score_thr > 0:
            results = results[results.scores > score_thr]
        nms_cfg = self.test_cfg.get('nms', None)
        if nms_cfg is not None and len(results) > 0:
            dets, keep = batched_nms(results.bboxes, results.scores,
                                     results.labels, nms_cfg)
            results = results[keep]
            results.scores = dets[:, -1]
            results = results[:self.test_cfg.get('max_per_img', self.num_query
                                                 )]
        return results

    # ------------------------------------------------------------------
    # Auxiliary positive queries (collaborative hybrid assignment)
    # ------------------------------------------------------------------

    def loss_aux(self, x: Sequence[Tensor], pos_coords: tuple, head_idx: int,
                 batch_data_samples: SampleList) -> Dict[str, Tensor]:
        """Losses of the queries built from auxiliary head ``head_idx``'s
        positive boxes (one group per image, padded to a common size).

        Args:
            x (list[Tensor]): Encoder feature maps from :meth:`loss`
                (levels plus the downsampled one).
            pos_coords (tuple): ``(boxes, labels, targets, [feats,] name)``
                from the auxiliary head; boxes and targets (x1, y1, x2, y2)
                per prior, labels with ``num_classes`` as background.
            head_idx (int): Index of the auxiliary head.
            batch_data_samples (list[:obj:`DetDataSample`]): The batch.

        Returns:
            dict[str, Tensor]: ``loss_cls_aux``, ``loss_bbox_aux``,
            ``loss_iou_aux`` of the last layer and ``d{i}.*`` of the rest.
        """
        batch_img_metas = [s.metainfo for s in batch_data_samples]
        targets = self.get_aux_targets(pos_coords, batch_img_metas, x)
        coords, labels, bbox_targets, label_weights, bbox_weights, feats, \
            attn_mask = targets
        # Masks only: the auxiliary queries carry their own positions
        # (upstream also computes the sine positions here, then drops them).
        masks = self._padding_masks(x[:-1], batch_img_metas)
        states, references = self.transformer.forward_aux(
            x[:-1], masks, coords, self.reg_branches, head_idx, feats,
            attn_mask)
        all_classes, all_coords = self._predictions(states, references)
        losses_cls, losses_bbox, losses_iou = [], [], []
        for cls_scores, bbox_preds in zip(all_classes, all_coords):
            loss_cls, loss_bbox, loss_iou = self.loss_single_aux(
                cls_scores, bbox_preds, labels, label_weights, bbox_targets,
                bbox_weights, batch_img_metas)
            losses_cls.append(loss_cls)
            losses_bbox.append(loss_bbox)
            losses_iou.append(loss_iou)
        losses = dict(
            loss_cls_aux=losses_cls[-1],
            loss_bbox_aux=losses_bbox[-1],
            loss_iou_aux=losses_iou[-1])
        for layer in range(len(losses_cls) - 1):
            losses[f'd{layer}.loss_cls_aux'] = losses_cls[layer]
            losses[f'd{layer}.loss_bbox_aux'] = losses_bbox[layer]
            losses[f'd{layer}.loss_iou_aux'] = losses_iou[layer]
        return losses

    def get_aux_targets(self, pos_coords: tuple, batch_img_metas: List[dict],
                        mlvl_feats: Sequence[Tensor]) -> Tuple:
        """Turn an auxiliary head's assignment into one query group per
        image, all of the same size ``n`` (at least 9, at most
        ``max_pos_coords``, the batch's largest positive count otherwise).

        Same algorithm as upstream, with random draws on the tensors'
        device. Padding is random negatives (trained as background) or,
        with ``use_zero_padding``, zero-weighted empty queries. An image
        without GT gets ``n`` padding queries, so every rank builds the
        same modules and loss terms.

        Returns:
            tuple: coords (bs, n, 4) normalized (cx, cy, w, h), labels
            (bs, n), targets (bs, n, 4), label weights (bs, n), box weights
            (bs, n, 4), features (bs, n, C), self-attention mask or None.
        """
        boxes, labels, targets = pos_coords[:3]
        head_name = pos_coords[-1]
        channels = mlvl_feats[0].size(1)
        batch_size = len(boxes)
        flat_feats = torch.cat(
            [f.flatten(2).transpose(1, 2) for f in mlvl_feats], 1)
        positives = [((label >= 0) &
                      (label < self.num_classes)).nonzero(as_tuple=True)[0]
                     for label in labels]
        num_queries = max(max(len(p) for p in positives), 0)
        num_queries = max(MIN_AUX_QUERIES, min(self.max_pos_coords,
                                               num_queries))

        label_weights = boxes[0].new_zeros((batch_size, num_queries))
        bbox_weights = boxes[0].new_zeros((batch_size, num_queries, 4))
        out_coords, out_labels, out_targets, out_feats, masks = \
            [], [], [], [], []
        for index in range(batch_size):
            if head_name == 'rcnn':
                feats = pos_coords[-2][index]
            else:
                per_point = boxes[index].size(0) // flat_feats.size(1)
                feats = flat_feats[index].repeat_interleave(per_point, 0)
            img_h, img_w = batch_img_metas[index]['img_shape']
            factor = boxes[index].new_tensor([img_w, img_h, img_w, img_h])
            pos = positives[index]
            if len(pos) > num_queries:
                pos = pos[torch.randperm(len(pos),
                                         device=pos.device)[:num_queries]]
            num_pos = len(pos)
            chosen = pos
            num_pad = num_queries - num_pos
            if not self.use_zero_padding and num_pad > 0:
                negatives = (labels[index] == self.num_classes).nonzero(
                    as_tuple=True)[0]
                negatives = negatives[torch.randperm(
                    len(negatives), device=negatives.device)[:num_pad]]
                chosen = torch.cat([pos, negatives])
            coord = bbox_xyxy_to_cxcywh(boxes[index][chosen] / factor)
            target = bbox_xyxy_to_cxcywh(targets[index][chosen] / factor)
            label = labels[index][chosen]
            feat = feats[chosen]
            num_pad = num_queries - len(chosen)
            if num_pad > 0:
                coord = torch.cat([coord, coord.new_zeros((num_pad, 4))])
                target = torch.cat([target, target.new_zeros((num_pad, 4))])
                label = torch.cat(
                    [label,
                     label.new_full((num_pad, ), self.num_classes)])
                feat = torch.cat([feat, feat.new_zeros((num_pad, channels))])
            if self.use_zero_padding:
                label_weights[index, :num_pos] = 1
                masks.append(
                    self._aux_attn_mask(num_pos, num_queries, coord.device))
            else:
                label_weights[index, :len(chosen)] = 1
            bbox_weights[index, :num_pos] = 1
            out_coords.append(coord)
            out_labels.append(label)
            out_targets.append(target)
            out_feats.append(feat)
        attn_mask = None
        if self.use_zero_padding:
            num_heads = self.transformer.decoder.layers[0].attentions[
                0].num_heads
            attn_mask = torch.stack(masks).repeat_interleave(num_heads, 0)
        return (torch.stack(out_coords), torch.stack(out_labels),
                torch.stack(out_targets), label_weights, bbox_weights,
                torch.stack(out_feats), attn_mask)

    @staticmethod
    def _aux_attn_mask(num_real: int, num_queries: int,
                       device: torch.device) -> Tensor:
        """Self-attention mask: nothing attends to a padding query except
        that query itself, and padding queries do not see real ones."""
        mask = torch.zeros((num_queries, num_queries),
                           dtype=torch.bool,
                           device=device)
        mask[:, num_real:] = True
        mask[num_real:, :num_real] = True
        pad = torch.arange(num_real, num_queries, device=device)
        mask[pad, pad] = False
        return mask

    def loss_single_aux(self, cls_scores: Tensor, bbox_preds: Tensor,
                        labels: Tensor, label_weights: Tensor,
                        bbox_targets: Tensor, bbox_weights: Tensor,
                        batch_img_metas: List[dict]) -> Tuple[Tensor, ...]:
        """Loss of one decoder layer's auxiliary queries.

        Same terms as upstream's ``loss_single_aux`` (quality focal loss
        on the IoU of each positive, L1 and GIoU on positives) without its
        early-return ``except`` path: the targets are always (bs, n), and
        both ``reduce_mean`` calls run on every rank.
        """
        num_imgs, num_queries = cls_scores.shape[:2]
        labels = labels.reshape(-1)
        label_weights = label_weights.reshape(-1)
        bbox_targets = bbox_targets.reshape(-1, 4)
        bbox_weights = bbox_weights.reshape(-1, 4)
        cls_scores = cls_scores.reshape(-1, self.cls_out_channels)
        bbox_preds = bbox_preds.reshape(-1, 4)

        pos_inds = ((labels >= 0) &
                    (labels < self.num_classes)).nonzero(as_tuple=True)[0]
        num_pos = len(pos_inds)
        cls_avg_factor = num_pos + (num_imgs * num_queries -
                                    num_pos) * self.bg_cls_weight
        cls_avg_factor = cls_scores.new_tensor([cls_avg_factor])
        if self.sync_cls_avg_factor:
            cls_avg_factor = reduce_mean(cls_avg_factor)
        cls_avg_factor = max(cls_avg_factor.item(), 1)

        scores = label_weights.new_zeros(labels.shape)
        scores[pos_inds] = bbox_overlaps(
            bbox_cxcywh_to_xyxy(bbox_preds[pos_inds]).detach(),
            bbox_cxcywh_to_xyxy(bbox_targets[pos_inds]),
            is_aligned=True)
        loss_cls = self.loss_cls(
            cls_scores, (labels, scores),
            weight=label_weights,
            avg_factor=cls_avg_factor)

        num_total_pos = reduce_mean(cls_scores.new_tensor([num_pos]))
        num_total_pos = torch.clamp(num_total_pos, min=1).item()
        factors = torch.cat([
            bbox_preds.new_tensor([w, h, w, h]).expand(num_queries, 4)
            for h, w in (meta['img_shape'] for meta in batch_img_metas)
        ])
        loss_iou = self.loss_iou(
            bbox_cxcywh_to_xyxy(bbox_preds) * factors,
            bbox_cxcywh_to_xyxy(bbox_targets) * factors,
            bbox_weights,
            avg_factor=num_total_pos)
        loss_bbox = self.loss_bbox(
            bbox_preds, bbox_targets, bbox_weights, avg_factor=num_total_pos)
        return loss_cls, loss_bbox, loss_iou
