"""D-FINE head: prediction branches and upstream D-FINE's criterion,
normalised over ranks and DDP-safe on batches without GT."""
import inspect
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox_overlaps, bbox_xyxy_to_cxcywh
from mmdet.utils import InstanceList, reduce_mean
from mmengine.structures import InstanceData
from torch import Tensor, nn

from mmddp_ext.models.dense_heads import DDPSafeDINOHead
from mmddp_ext.models.layers import DUMMY_DN_GROUP_KEY
from .dfine_decoder_layers import MLP
from .fdr import bbox2distance
from .ports import RTDETRHead

# Pairs (query index, GT index) of one image.
Matching = Tuple[Tensor, Tensor]
# DDF mixes matched and unmatched means with sqrt(count * 8 / batch size)
# (upstream: "avoid the influence of batch size per GPU").
DDF_BATCH_REFERENCE = 8


def cxcywh_to_xyxy(boxes: Tensor) -> Tensor:
    """(cx, cy, w, h) to (x1, y1, x2, y2) with negative sizes clamped to
    0, as upstream D-FINE's ``box_cxcywh_to_xyxy`` (a refined box can have
    a negative size; mmdet's conversion keeps it)."""
    centre, size = boxes[..., :2], boxes[..., 2:].clamp(min=0.0)
    return torch.cat([centre - 0.5 * size, centre + 0.5 * size], -1)


@MODELS.register_module()
class DFINEHead(DDPSafeDINOHead):
    """Prediction branches and loss of D-FINE.

    Layout (the mmdet two-stage convention, as :class:`RTDETRHead`):
    ``cls_branches[i]`` / ``reg_branches[i]`` are upstream's
    ``dec_score_head[i]`` / ``dec_bbox_head[i]`` (a 3-layer MLP to the
    logits of four edge distributions, ``4 * (reg_max + 1)``), the last
    pair is ``enc_score_head`` / ``enc_bbox_head`` (query selection), and
    ``pre_bbox_head`` is upstream's (the box of decoder layer 0). The
    decoder (:class:`DFINEDecoder`) applies them; ``loss`` and
    ``predict`` receive its outputs.

    ``loss`` replaces ``DINOHead.loss`` with upstream's ``DFINECriterion``
    (losses ``vfl``, ``boxes``, ``local``), term for term and with
    upstream's key names:

    - every decoder layer (the last: ``loss_vfl`` ...; earlier ones:
      ``..._aux_{i}``), the layer-0 box (``..._pre``), the selected
      encoder queries (``..._enc_0``), and the same for the denoising
      queries (``..._dn_{i}``, ``..._dn_pre``);
    - ``loss_vfl``: varifocal loss on each output's own Hungarian
      matching, divided by the GT count; ``loss_bbox`` (L1) and
      ``loss_giou`` on the union of all matchings of the batch (each
      query keeps the GT it was matched to most often: GO-LSD's
      "global optimal" matching), divided by the union's size;
      ``loss_fgl`` (:class:`FineGrainedLocalizationLoss`) on the same
      union, for outputs with edge distributions; ``loss_ddf``
      (:class:`DecoupledDistillationFocalLoss`) for every decoder layer
      but the last (which gets an exact 0 for its dn copy, as upstream);
    - dn outputs use the dn queries' own GT (no matching), divided by the
      dn positive count.

    DDP: every divisor is a count averaged over ranks, all of them taken
    by one ``reduce_mean`` per step, whatever the data (upstream issues
    two all-reduces and divides DDF by the rank's own counts; the counts
    are the same on one rank). The dummy dn group of a GT-less batch
    (``dn_meta['dummy_dn_group']``, from the DDP-safe generator) gets zero
    weight in every dn term, so it adds nothing but the graph connection,
    and every rank returns the same loss keys. No loss is made finite
    after the fact (upstream applies ``nan_to_num`` to every loss): a NaN
    reaches the optimizer wrapper, where mmddp_ext's all-ranks check skips
    the step on every rank.

    Args:
        reg_max (int): Index of the last bin. Set by :class:`DFINE` from
            ``decoder.reg_max``. Defaults to 32.
        eval_idx (int): Last decoder layer run at test time; set by
            :class:`DFINE`. Defaults to -1.
        layer_scale (float): Width multiplier of the layers after
            ``eval_idx``; set by :class:`DFINE`. Defaults to 1.
        mlp_act (str): Activation of the box MLPs; set by :class:`DFINE`
            from its ``mlp_act``. Defaults to 'relu'.
        loss_fgl (dict): Config of the FGL loss. Defaults to
            ``dict(type='FineGrainedLocalizationLoss', loss_weight=0.15)``.
        loss_ddf (dict): Config of the DDF loss. Defaults to
            ``dict(type='DecoupledDistillationFocalLoss', temperature=5.0,
            loss_weight=1.5)``.
        **kwargs: Keys of ``DINOHead`` (``num_classes``, ``embed_dims``,
            ``loss_cls`` (a loss taking the one-hot classes as
            ``labels``, e.g. ``RTDETRVarifocalLoss``), ``loss_bbox``,
            ``loss_iou``, ``train_cfg``, ``test_cfg``).
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self,
                 *args,
                 reg_max: int = 32,
                 eval_idx: int = -1,
                 layer_scale: float = 1,
                 mlp_act: str = 'relu',
                 loss_fgl: dict = dict(
                     type='FineGrainedLocalizationLoss', loss_weight=0.15),
                 loss_ddf: dict = dict(
                     type='DecoupledDistillationFocalLoss',
                     temperature=5.0,
                     loss_weight=1.5),
                 **kwargs) -> None:
        self.reg_max = reg_max
        self.eval_idx = eval_idx
        self.layer_scale = layer_scale
        self.mlp_act = mlp_act
        super().__init__(*args, **kwargs)
        self.loss_fgl = MODELS.build(loss_fgl)
        self.loss_ddf = MODELS.build(loss_ddf)
        if 'labels' not in inspect.signature(self.loss_cls.forward).parameters:
            raise TypeError(
                'DFINEHead passes IoU-aware score targets and the one-hot '
                'classes (labels=...) to bbox_head.loss_cls, but '
                f'{type(self.loss_cls).__name__}.forward takes no labels. '
                "Use loss_cls=dict(type='RTDETRVarifocalLoss', alpha=0.75, "
                'gamma=2.0, loss_weight=1.0) (upstream D-FINE) or a loss '
                'with the same signature.')

    def _init_layers(self) -> None:
        """Replaces ``DeformableDETRHead._init_layers``: per-layer class
        and edge-distribution branches (wider after ``eval_idx`` with
        ``layer_scale``), the encoder pair and ``pre_bbox_head``."""
        num_layers = self.num_pred_layer - 1
        dims = self.embed_dims
        eval_idx = self.eval_idx % num_layers
        corners = 4 * (self.reg_max + 1)
        widths = [
            dims if i <= eval_idx else round(self.layer_scale * dims)
            for i in range(num_layers)
        ]
        self.cls_branches = nn.ModuleList(
            [nn.Linear(w, self.cls_out_channels)
             for w in widths] + [nn.Linear(dims, self.cls_out_channels)])
        self.reg_branches = nn.ModuleList(
            [MLP(w, w, corners, 3, self.mlp_act)
             for w in widths] + [MLP(dims, dims, 4, 3, self.mlp_act)])
        self.pre_bbox_head = MLP(dims, dims, 4, 3, self.mlp_act)

    def init_weights(self) -> None:
        """Upstream's init: class biases at prior 0.01, last layer of
        every box MLP zero (so the first edge distributions are uniform
        and the first boxes are the anchors)."""
        prior_bias = float(-torch.log(torch.tensor((1 - 0.01) / 0.01)))
        for branch in self.cls_branches:
            nn.init.constant_(branch.bias, prior_bias)
        for mlp in [*self.reg_branches, self.pre_bbox_head]:
            nn.init.constant_(mlp.layers[-1].weight, 0)
            nn.init.constant_(mlp.layers[-1].bias, 0)

    # RT-DETR's post-processing is upstream D-FINE's (top-k of the
    # flattened sigmoid scores, boxes not clamped).
    _predict_by_feat_single = RTDETRHead._predict_by_feat_single

    def forward(self, layers_scores: Tensor, layers_boxes: Tensor,
                **kwargs) -> Tuple[Tensor, Tensor]:
        """The decoder already applied the branches: returns its class
        logits and (cx, cy, w, h) boxes, (num_run, bs, num_queries, ...).
        """
        return layers_scores, layers_boxes

    def predict(self,
                layers_scores: Tensor,
                layers_boxes: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True,
                **kwargs) -> InstanceList:
        """Detections from the last decoder layer run (``eval_idx``).

        Replaces ``DETRHead.predict``, which would run ``forward`` on
        hidden states.
        """
        batch_img_metas = [s.metainfo for s in batch_data_samples]
        return self.predict_by_feat(
            layers_scores, layers_boxes, batch_img_metas, rescale=rescale)

    def loss(self, layers_scores: Tensor, layers_boxes: Tensor,
             layers_corners: Tensor, ref_boxes: Tensor, pre_scores: Tensor,
             pre_boxes: Tensor, up: Tensor, reg_scale: Tensor,
             enc_outputs_class: Tensor, enc_outputs_coord: Tensor,
             dn_meta: Dict,
             batch_data_samples: SampleList) -> Dict[str, Tensor]:
        """Upstream D-FINE's losses (see the class docstring).

        Args:
            layers_scores (Tensor): (num_layers, bs, num_dn + num_queries,
                classes), LQE included.
            layers_boxes (Tensor): (num_layers, bs, num_dn + num_queries,
                4), normalised (cx, cy, w, h).
            layers_corners (Tensor): (num_layers, bs, num_dn + num_queries,
                4 * (reg_max + 1)) edge logits.
            ref_boxes (Tensor): The layer-0 boxes every layer refines,
                (bs, num_dn + num_queries, 4), detached.
            pre_scores (Tensor): Layer-0 class logits (no LQE), (bs,
                num_dn + num_queries, classes).
            pre_boxes (Tensor): Layer-0 boxes, (bs, num_dn + num_queries,
                4).
            up (Tensor): The decoder's ``up``, (1,).
            reg_scale (Tensor): The decoder's ``reg_scale``, (1,).
            enc_outputs_class (Tensor): Selected encoder logits, (bs,
                num_queries, classes).
            enc_outputs_coord (Tensor): Their boxes, (bs, num_queries, 4).
            dn_meta (dict): From the dn query generator.
            batch_data_samples (list[:obj:`DetDataSample`]): With GT.

        Returns:
            dict[str, Tensor]: Weighted losses, upstream's keys.
        """
        gts = [s.gt_instances for s in batch_data_samples]
        metas = [s.metainfo for s in batch_data_samples]
        targets = self._normalised_targets(gts, metas)
        num_dn = dn_meta['num_denoising_queries']

        def split(x: Tensor) -> Tuple[Tensor, Tensor]:
            return x[..., :num_dn, :], x[..., num_dn:, :]

        dn_scores, scores = split(layers_scores)
        dn_boxes, boxes = split(layers_boxes)
        dn_corners, corners = split(layers_corners)
        dn_refs, refs = split(ref_boxes)
        dn_pre_scores, pre_scores = split(pre_scores)
        dn_pre_boxes, pre_boxes = split(pre_boxes)
        num_layers = len(scores)

        # Each output's own matching; the union in upstream's order: the
        # last layer, the earlier ones, layer 0's box, the encoder.
        outputs = [(scores[i], boxes[i]) for i in range(num_layers)]
        outputs += [(pre_scores, pre_boxes),
                    (enc_outputs_class, enc_outputs_coord)]
        matchings = [self._match(s, b, gts, metas) for s, b in outputs]
        union = self.union_matching([matchings[num_layers - 1]] +
                                    matchings[:num_layers - 1] +
                                    matchings[num_layers:])
        dummy = bool(dn_meta.get(DUMMY_DN_GROUP_KEY, False))
        dn_pairs = self._dn_matching(gts, dn_meta)
        norms = self._normalisers(targets, union, dn_pairs, scores.shape[1:3],
                                  num_dn, dummy)
        fdr = (up, reg_scale)
        match = dict(
            pairs=union,
            num_boxes=norms['num_go'],
            edges=norms['edges'],
            mix=norms['mix'],
            fgl=self._fgl_targets(refs, union, targets, fdr),
            teacher=(scores[-1], corners[-1]),
            query_weight=1.0)
        dn = dict(
            pairs=dn_pairs,
            num_boxes=norms['num_dn'],
            edges=norms['dn_edges'],
            mix=norms['mix'],
            fgl=self._fgl_targets(dn_refs, dn_pairs, targets, fdr),
            teacher=(dn_scores[-1], dn_corners[-1]),
            query_weight=0.0 if dummy else 1.0)

        losses = {}
        for i in range(num_layers):
            last = i == num_layers - 1
            losses.update(
                self._output_losses(
                    scores[i],
                    boxes[i],
                    corners[i],
                    matchings[i],
                    norms['num_gt'],
                    match,
                    targets,
                    '' if last else f'_aux_{i}',
                    distill=not last))
        for (out_scores,
             out_boxes), pairs, suffix in zip(outputs[num_layers:],
                                              matchings[num_layers:],
                                              ('_pre', '_enc_0')):
            losses.update(
                self._output_losses(out_scores, out_boxes, None, pairs,
                                    norms['num_gt'], match, targets, suffix))
        for i in range(num_layers):
            losses.update(
                self._output_losses(
                    dn_scores[i],
                    dn_boxes[i],
                    dn_corners[i],
                    dn_pairs,
                    norms['num_dn'],
                    dn,
                    targets,
                    f'_dn_{i}',
                    distill=i < num_layers - 1,
                    zero_ddf=i == num_layers - 1))
        losses.update(
            self._output_losses(dn_pre_scores, dn_pre_boxes, None, dn_pairs,
                                norms['num_dn'], dn, targets, '_dn_pre'))
        return losses

    @staticmethod
    def _normalised_targets(gts: InstanceList,
                            metas: List[dict]) -> List[InstanceData]:
        """GT per image: ``labels`` and ``boxes``, normalised (cx, cy, w,
        h) by the image size, as upstream's ``ConvertBoxes``."""
        targets = []
        for gt, meta in zip(gts, metas):
            height, width = meta['img_shape']
            factor = gt.bboxes.new_tensor([width, height, width, height])
            targets.append(
                InstanceData(
                    labels=gt.labels,
                    boxes=bbox_xyxy_to_cxcywh(gt.bboxes / factor)))
        return targets

    def _match(self, scores: Tensor, boxes: Tensor, gts: InstanceList,
               metas: List[dict]) -> List[Matching]:
        """Hungarian matching of one output with ``train_cfg.assigner``,
        per image, as (query index, GT index) pairs sorted by query.

        Non-finite predictions are made finite for the matching only (the
        solver refuses NaN costs; upstream sets NaN costs to 1), so that
        the loss, computed from the raw predictions, is the one that shows
        them. The costs are computed in float32 also under autocast
        (``_matching_inputs``)."""
        pairs = []
        for score, box, gt, meta in zip(scores, boxes, gts, metas):
            score, box = self._matching_inputs(score.detach(), box.detach())
            height, width = meta['img_shape']
            factor = box.new_tensor([width, height, width, height])
            prediction = InstanceData(
                scores=_finite(score),
                bboxes=cxcywh_to_xyxy(_finite(box)) * factor)
            assigned = self.assigner.assign(
                pred_instances=prediction, gt_instances=gt,
                img_meta=meta).gt_inds
            query = torch.nonzero(assigned > 0, as_tuple=False).squeeze(1)
            pairs.append((query, assigned[query] - 1))
        return pairs

    @staticmethod
    def union_matching(matchings: Sequence[List[Matching]]) -> List[Matching]:
        """Union of several matchings of the same batch (upstream
        ``_get_go_indices``): per image, each query keeps the GT it is
        paired with most often. Ties are broken as upstream breaks them
        (``torch.argsort`` of the counts of the lexicographically sorted
        unique pairs), so the same pairs come out, in the order they are
        kept.

        Args:
            matchings (Sequence[list]): Per output, per image (query, GT)
                index pairs.

        Returns:
            list[tuple[Tensor, Tensor]]: Per image (query, GT) pairs.
        """
        union = []
        for image_pairs in zip(*matchings):
            pairs = torch.cat([torch.stack([q, g], 1) for q, g in image_pairs])
            if len(pairs):
                unique, counts = torch.unique(pairs, return_counts=True, dim=0)
                ranked = unique[torch.argsort(counts, descending=True)]
                queries, inverse = torch.unique(
                    ranked[:, 0], return_inverse=True)
                positions = torch.arange(len(ranked), device=ranked.device)
                first = positions.new_full(
                    (len(queries), ),
                    len(ranked)).scatter_reduce(0, inverse, positions, 'amin')
                pairs = ranked[first.sort().values]
            union.append((pairs[:, 0], pairs[:, 1]))
        return union

    @staticmethod
    def _dn_matching(gts: InstanceList, dn_meta: Dict) -> List[Matching]:
        """Dn queries and their GT (upstream
        ``get_cdn_matched_indices``): in group ``g`` the positive query of
        GT ``j`` is ``2 * max_gt * g + j``; none in the dummy group."""
        groups = dn_meta['num_denoising_groups']
        group_size = dn_meta['num_denoising_queries'] // max(groups, 1)
        dummy = dn_meta.get(DUMMY_DN_GROUP_KEY, False)
        pairs = []
        for gt in gts:
            device = gt.labels.device
            gt_index = torch.arange(
                0 if dummy else len(gt.labels), device=device)
            starts = torch.arange(groups, device=device) * group_size
            pairs.append(((starts[:, None] + gt_index[None]).flatten(),
                          gt_index.repeat(groups)))
        return pairs

    @staticmethod
    def _normalisers(targets: List[InstanceData], union: List[Matching],
                     dn_pairs: List[Matching], batch_queries: Tuple[int, int],
                     num_dn: int, dummy: bool) -> Dict:
        """Every divisor of the loss, from one ``reduce_mean`` of the local
        counts, issued on every rank whatever its data: GT boxes, union
        pairs and dn positives (each at least 1, as upstream), and the
        matched and unmatched edge counts of the DDF terms (0 becomes 1:
        its sum is 0 too)."""
        bs, num_queries = batch_queries
        num_gt = sum(len(t.labels) for t in targets)
        num_go = sum(len(q) for q, _ in union)
        num_dn_pos = sum(len(q) for q, _ in dn_pairs)
        dn_negatives = 0 if dummy else bs * num_dn - num_dn_pos
        counts = targets[0].boxes.new_tensor([
            num_gt, num_go, num_dn_pos, 4 * num_go,
            4 * (bs * num_queries - num_go), 4 * num_dn_pos, 4 * dn_negatives
        ])
        (num_gt, num_go, num_dn_pos, go_edges, other_edges, dn_edges,
         dn_other_edges) = reduce_mean(counts)

        def nonzero(x: Tensor) -> Tensor:
            return torch.where(x > 0, x, torch.ones_like(x))

        batch_scale = DDF_BATCH_REFERENCE / bs
        return dict(
            num_gt=num_gt.clamp(min=1),
            num_go=num_go.clamp(min=1),
            num_dn=num_dn_pos.clamp(min=1),
            edges=(nonzero(go_edges), nonzero(other_edges)),
            dn_edges=(nonzero(dn_edges), nonzero(dn_other_edges)),
            mix=((go_edges * batch_scale).sqrt(),
                 (other_edges * batch_scale).sqrt()))

    def _fgl_targets(self, refs: Tensor, pairs: List[Matching],
                     targets: List[InstanceData],
                     fdr: Tuple[Tensor, Tensor]) -> Tuple[Tensor, ...]:
        """Bin positions and weights of the matched GT edges relative to
        their reference boxes; computed once per part, as every layer
        refines the same reference boxes."""
        batch, query = _flat_index(pairs)
        up, reg_scale = fdr
        return bbox2distance(refs[batch, query],
                             cxcywh_to_xyxy(_matched(pairs, targets, 'boxes')),
                             self.reg_max, reg_scale, up)

    def _output_losses(self,
                       scores: Tensor,
                       boxes: Tensor,
                       corners: Optional[Tensor],
                       cls_pairs: List[Matching],
                       num_cls: Tensor,
                       part: Dict,
                       targets: List[InstanceData],
                       suffix: str,
                       distill: bool = False,
                       zero_ddf: bool = False) -> Dict[str, Tensor]:
        """``loss_vfl``, ``loss_bbox``, ``loss_giou`` and, with edge
        distributions, ``loss_fgl`` (and ``loss_ddf`` when ``distill`` or
        ``zero_ddf``) of one output, keys ending in ``suffix``.

        Args:
            scores (Tensor): (bs, n, classes) logits.
            boxes (Tensor): (bs, n, 4) boxes.
            corners (Tensor, optional): (bs, n, 4 * (reg_max + 1)).
            cls_pairs (list): Matching of the classification term.
            num_cls (Tensor): Divisor of the classification term.
            part (dict): Pairs, divisors, FGL targets and teacher of the
                matching (or dn) part, see ``loss``.
            targets (list[InstanceData]): Normalised GT.
            suffix (str): Key suffix.
            distill (bool): Add the DDF term (a layer before the last).
            zero_ddf (bool): Add ``loss_ddf`` as an exact 0 (the last dn
                layer distils into itself, upstream's 0).
        """
        losses = dict(
            loss_vfl=self._vfl(scores, boxes, cls_pairs, targets, num_cls,
                               part['query_weight']))
        pairs = part['pairs']
        batch, query = _flat_index(pairs)
        matched_boxes = boxes[batch, query]
        gt_boxes = _matched(pairs, targets, 'boxes')
        # differs from mmdet's avg_factor reduction: the summed box terms
        # divided by the box count itself, as upstream (mmdet adds
        # float32's epsilon to the divisor: the same float32 bits from 4
        # boxes on, but 1.19e-7 / num_boxes apart in float64)
        losses['loss_bbox'] = self.loss_bbox(
            matched_boxes, gt_boxes,
            reduction_override='sum') / part['num_boxes']
        losses['loss_giou'] = self.loss_iou(
            cxcywh_to_xyxy(matched_boxes),
            cxcywh_to_xyxy(gt_boxes),
            reduction_override='sum') / part['num_boxes']
        if corners is None:
            return {k + suffix: v for k, v in losses.items()}
        ious = bbox_overlaps(
            cxcywh_to_xyxy(matched_boxes),
            cxcywh_to_xyxy(gt_boxes),
            is_aligned=True).detach()
        losses['loss_fgl'] = self.loss_fgl(
            corners[batch, query].reshape(-1, self.reg_max + 1),
            *part['fgl'],
            weight=ious.repeat_interleave(4),
            avg_factor=part['num_boxes'])
        if distill:
            losses['loss_ddf'] = self._ddf(corners, batch, query, ious, part)
        elif zero_ddf:
            losses['loss_ddf'] = corners.sum() * 0
        return {k + suffix: v for k, v in losses.items()}

    def _vfl(self, scores: Tensor, boxes: Tensor, pairs: List[Matching],
             targets: List[InstanceData], avg_factor: Tensor,
             query_weight: float) -> Tensor:
        """IoU-aware classification loss: the matched class's target is
        the IoU of the (detached) box with its GT, every other target 0."""
        batch, query = _flat_index(pairs)
        labels = _matched(pairs, targets, 'labels')
        ious = bbox_overlaps(
            cxcywh_to_xyxy(boxes[batch, query]).detach(),
            cxcywh_to_xyxy(_matched(pairs, targets, 'boxes')),
            is_aligned=True)
        one_hot = torch.zeros_like(scores)
        one_hot[batch, query, labels] = 1
        score_target = torch.zeros_like(scores)
        score_target[batch, query, labels] = ious.to(scores.dtype)
        weight = scores.new_full((scores.shape[0] * scores.shape[1], 1),
                                 query_weight)
        return self.loss_cls(
            scores.flatten(0, 1),
            score_target.flatten(0, 1),
            weight=weight,
            avg_factor=avg_factor,
            labels=one_hot.flatten(0, 1))

    def _ddf(self, corners: Tensor, batch: Tensor, query: Tensor, ious: Tensor,
             part: Dict) -> Tensor:
        """DDF of one layer against the part's teacher: matched queries
        weighted by their IoU, the others by the teacher's best score."""
        teacher_scores, teacher_corners = part['teacher']
        weight = teacher_scores.detach().sigmoid().max(-1)[0]
        weight[batch, query] = ious.to(weight.dtype)
        weight = weight * part['query_weight']
        matched = torch.zeros_like(weight, dtype=torch.bool)
        matched[batch, query] = True
        bins = self.reg_max + 1
        return self.loss_ddf(
            corners.reshape(-1, bins), teacher_corners.reshape(-1, bins),
            weight.repeat_interleave(4, dim=-1).flatten(),
            matched.repeat_interleave(4, dim=-1).flatten(), *part['edges'],
            *part['mix'])


def _finite(x: Tensor) -> Tensor:
    """NaN to 0 and infinities to +-1e4: costs the solver accepts."""
    return torch.nan_to_num(x, nan=0.0, posinf=1e4, neginf=-1e4)


def _flat_index(pairs: List[Matching]) -> Tuple[Tensor, Tensor]:
    """Batch and query indices of per-image pairs, concatenated."""
    batch = torch.cat(
        [torch.full_like(q, i) for i, (q, _) in enumerate(pairs)])
    return batch, torch.cat([q for q, _ in pairs])


def _matched(pairs: List[Matching], targets: List[InstanceData],
             field: str) -> Tensor:
    """The matched GT ``field`` ('boxes' or 'labels'), concatenated."""
    return torch.cat(
        [getattr(t, field)[g] for t, (_, g) in zip(targets, pairs)])
