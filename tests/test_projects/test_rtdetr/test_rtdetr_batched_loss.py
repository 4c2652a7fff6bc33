"""RTDETRHead's batched loss path against mmdet's per-image one.

The reference is the path RTDETRHead took before it batched: mmdet's
``get_targets`` (``HungarianAssigner.assign`` per image, predictions in
pixels) and ``get_dn_targets`` (``DDPSafeDINOHead``'s zero-weight dummy
group), then the varifocal, L1 and GIoU terms over every query with the
targets' weights. The batch mixes GT counts, an image without GT and
image sizes.
"""
import pytest
import torch
import torch.nn.functional as F
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_overlaps
from mmengine.structures import InstanceData

from .rtdetr_utils import R18VD_CONFIG, build_tiny, host_reads

# an image without GT in the middle and at the end
GT_COUNTS = [3, 0, 5, 1, 0]
IMG_SHAPES = [(96, 128), (64, 64), (80, 96), (96, 96), (64, 96)]
NUM_QUERIES = 30  # the tiny config's
NUM_DN_TARGETS = 10  # the tiny config's num_dn_queries


@pytest.fixture(scope='module')
def head():
    return build_tiny().bbox_head


def _gt(counts, seed=0):
    gen = torch.Generator().manual_seed(seed)
    gts = []
    for count, (height, width) in zip(counts, IMG_SHAPES):
        xy = torch.rand(count, 2, generator=gen) * 0.6
        wh = torch.rand(count, 2, generator=gen) * 0.3 + 0.05
        scale = torch.tensor([width, height, width, height])
        gts.append(
            InstanceData(
                bboxes=torch.cat([xy, xy + wh], 1) * scale,
                labels=torch.randint(0, 2, (count, ), generator=gen)))
    return gts, [dict(img_shape=shape) for shape in IMG_SHAPES]


def _outputs(counts, num_layers=2, num_classes=2, seed=1):
    """Random decoder outputs (dn part first), encoder outputs and the
    dn_meta the query generator gives for ``counts``."""
    max_gt = max(counts)
    if max_gt:
        groups = NUM_DN_TARGETS // max_gt
        dn_meta = dict(
            num_denoising_queries=2 * max_gt * groups,
            num_denoising_groups=groups,
            dummy_dn_group=False)
    else:
        dn_meta = dict(
            num_denoising_queries=2,
            num_denoising_groups=1,
            dummy_dn_group=True)
    total = dn_meta['num_denoising_queries'] + NUM_QUERIES
    gen = torch.Generator().manual_seed(seed)
    bs = len(counts)
    return dict(
        all_layers_cls_scores=torch.randn(
            num_layers, bs, total, num_classes, generator=gen),
        all_layers_bbox_preds=torch.rand(
            num_layers, bs, total, 4, generator=gen) * 0.5 + 0.25,
        enc_cls_scores=torch.randn(
            bs, NUM_QUERIES, num_classes, generator=gen),
        enc_bbox_preds=torch.rand(bs, NUM_QUERIES, 4, generator=gen) * 0.5 +
        0.25), dn_meta


def _reference_set(head, cls_scores, bbox_preds, targets, metas):
    """The per-image path's terms of one set from mmdet-style targets."""
    labels, label_weights, bbox_targets, bbox_weights, num_pos, _ = targets
    labels, label_weights = torch.cat(labels), torch.cat(label_weights)
    bbox_targets, bbox_weights = torch.cat(bbox_targets), torch.cat(
        bbox_weights)
    scores = cls_scores.reshape(-1, head.cls_out_channels)
    boxes = bbox_preds.reshape(-1, 4)
    avg_factor = scores.new_tensor(float(num_pos)).clamp(min=1)
    one_hot = F.one_hot(labels, head.num_classes + 1)[:, :-1]
    positive = labels < head.num_classes
    ious = scores.new_zeros(labels.shape)
    ious[positive] = bbox_overlaps(
        bbox_cxcywh_to_xyxy(boxes[positive]).detach(),
        bbox_cxcywh_to_xyxy(bbox_targets[positive]),
        is_aligned=True)
    loss_cls = head.loss_cls(
        scores,
        one_hot * ious[:, None],
        weight=label_weights[:, None],
        avg_factor=avg_factor,
        labels=one_hot)
    factors = torch.cat([
        boxes.new_tensor([w, h, w, h]).expand(cls_scores.size(1), 4)
        for h, w in (meta['img_shape'] for meta in metas)
    ])
    loss_iou = head.loss_iou(
        bbox_cxcywh_to_xyxy(boxes) * factors,
        bbox_cxcywh_to_xyxy(bbox_targets) * factors,
        bbox_weights,
        avg_factor=avg_factor)
    loss_bbox = head.loss_bbox(
        boxes, bbox_targets, bbox_weights, avg_factor=avg_factor)
    return loss_cls, loss_bbox, loss_iou


def reference_losses(head, outputs, gts, metas, dn_meta):
    """The loss dict of mmdet's per-image path, in DINOHead's key order."""
    layers_cls, layers_boxes, dn_cls, dn_boxes = head.split_outputs(
        outputs['all_layers_cls_scores'], outputs['all_layers_bbox_preds'],
        dn_meta)
    sets = list(zip(layers_cls, layers_boxes)) + [
        (outputs['enc_cls_scores'], outputs['enc_bbox_preds'])
    ]
    matching = [
        _reference_set(head, cls, boxes,
                       head.get_targets(list(cls), list(boxes), gts, metas),
                       metas) for cls, boxes in sets
    ]
    dn_targets = head.get_dn_targets(gts, metas, dn_meta)
    dn = [
        _reference_set(head, cls, boxes, dn_targets, metas)
        for cls, boxes in zip(dn_cls, dn_boxes)
    ]
    names = ('loss_cls', 'loss_bbox', 'loss_iou')
    prefixes = [''] + [f'd{i}.' for i in range(len(layers_cls) - 1)]
    losses = {}
    for prefix, terms in zip(prefixes, [matching[-2]] + matching[:-2]):
        losses.update({prefix + n: t for n, t in zip(names, terms)})
    losses.update({'enc_' + n: t for n, t in zip(names, matching[-1])})
    for prefix, terms in zip(prefixes, [dn[-1]] + dn[:-1]):
        losses.update({prefix + 'dn_' + n: t for n, t in zip(names, terms)})
    return losses


def _leaves(outputs):
    return {k: v.clone().requires_grad_() for k, v in outputs.items()}


def _assigner(cfg_type, head):
    from mmdet.registry import TASK_UTILS
    return TASK_UTILS.build(
        dict(
            type=cfg_type,
            match_costs=[
                dict(type=type(c).__name__, weight=c.weight, **extra)
                for c, extra in zip(head.assigner.match_costs, (
                    dict(alpha=0.25, gamma=2.0), dict(box_format='xywh'),
                    dict(iou_mode='giou')))
            ]))


@pytest.mark.parametrize(
    'counts', [GT_COUNTS, [0] * len(GT_COUNTS)], ids=['mixed_gt', 'no_gt'])
def test_batched_losses_equal_the_per_image_path(head, counts):
    assert type(head.assigner).__name__ == 'BatchedHungarianAssigner'
    gts, metas = _gt(counts)
    outputs, dn_meta = _outputs(counts)
    ours_in, ref_in = _leaves(outputs), _leaves(outputs)
    ours = head.loss_by_feat(
        **ours_in,
        batch_gt_instances=gts,
        batch_img_metas=metas,
        dn_meta=dn_meta)
    ref = reference_losses(head, ref_in, gts, metas, dn_meta)
    assert list(ours) == list(ref)
    for key in ref:
        torch.testing.assert_close(
            ours[key], ref[key], rtol=1e-5, atol=1e-7, msg=key)
        # every term stays in the graph, GT or not (DDP)
        assert ours[key].requires_grad, key
    sum(ours.values()).backward()
    sum(ref.values()).backward()
    for key in outputs:
        torch.testing.assert_close(
            ours_in[key].grad, ref_in[key].grad, rtol=1e-5, atol=1e-7)


def test_batched_assignment_equals_per_image_hungarian(head):
    from mmdet.structures.bbox import bbox_xyxy_to_cxcywh
    gts, metas = _gt(GT_COUNTS)
    outputs, _ = _outputs(GT_COUNTS, num_layers=3)
    sets = [(outputs['all_layers_cls_scores'][i, :, -NUM_QUERIES:],
             outputs['all_layers_bbox_preds'][i, :, -NUM_QUERIES:])
            for i in range(3)]
    scales = torch.cat([
        torch.tensor([[w, h, w, h]] * len(gt), dtype=torch.float32)
        for gt, (h, w) in zip(gts, IMG_SHAPES)
    ]).reshape(-1, 4)
    corners = torch.cat([gt.bboxes for gt in gts]) / scales
    labels = torch.cat([gt.labels for gt in gts])
    batched = head.assigner.assign_batch([s for s, _ in sets],
                                         [b for _, b in sets], labels, corners,
                                         GT_COUNTS)
    per_image = _assigner('HungarianAssigner', head)
    offsets = [0, 3, 3, 8, 9]
    for (scores, boxes), (queries, gt_index) in zip(sets, batched):
        expected_q, expected_g = [], []
        for image, (gt, meta) in enumerate(zip(gts, metas)):
            h, w = meta['img_shape']
            pixels = bbox_cxcywh_to_xyxy(boxes[image]) * torch.tensor(
                [w, h, w, h])
            result = per_image.assign(
                InstanceData(scores=scores[image], bboxes=pixels), gt, meta)
            rows = (result.gt_inds > 0).nonzero().flatten()
            expected_q += (image * NUM_QUERIES + rows).tolist()
            expected_g += (offsets[image] + result.gt_inds[rows] - 1).tolist()
        assert queries.tolist() == expected_q
        assert gt_index.tolist() == expected_g
        assert len(queries) == sum(GT_COUNTS)  # min(queries, GT) each
    # the boxes it matched against are the targets' boxes
    assert torch.equal(
        bbox_xyxy_to_cxcywh(corners),
        torch.cat([
            bbox_xyxy_to_cxcywh(gt.bboxes / torch.tensor([w, h, w, h]))
            for gt, (h, w) in zip(gts, IMG_SHAPES)
        ]))


def test_loss_reads_the_device_once_per_step(head):
    """The batched path reads device data on the host once for the whole
    loss (the cost matrices of every layer), whatever the batch; no
    ``nonzero``, ``unique`` or ``item``. Controls: the same head with
    mmdet's ``HungarianAssigner`` (per-image ``assign``), and mmdet's
    per-image target path, read at least once per image and set."""
    gts, metas = _gt(GT_COUNTS)
    outputs, dn_meta = _outputs(GT_COUNTS, num_layers=3)
    inputs = dict(
        outputs,
        batch_gt_instances=gts,
        batch_img_metas=metas,
        dn_meta=dn_meta)
    assert host_reads(lambda: head.loss_by_feat(**inputs)) == 1
    num_sets, images_with_gt = 4, 3  # 3 decoder layers + the encoder
    assigner = head.assigner
    try:
        head.assigner = _assigner('HungarianAssigner', head)
        per_image = host_reads(lambda: head.loss_by_feat(**inputs))
    finally:
        head.assigner = assigner
    assert per_image >= num_sets * len(GT_COUNTS)
    mmdet_path = host_reads(
        lambda: reference_losses(head, outputs, gts, metas, dn_meta))
    assert mmdet_path >= 3 * num_sets * images_with_gt


def test_per_image_fallback_gives_the_same_losses(head):
    """An assigner without ``assign_batch`` runs per image: same losses."""
    gts, metas = _gt(GT_COUNTS)
    outputs, dn_meta = _outputs(GT_COUNTS)
    batched = head.loss_by_feat(
        **outputs,
        batch_gt_instances=gts,
        batch_img_metas=metas,
        dn_meta=dn_meta)
    assigner = head.assigner
    try:
        head.assigner = _assigner('HungarianAssigner', head)
        per_image = head.loss_by_feat(
            **outputs,
            batch_gt_instances=gts,
            batch_img_metas=metas,
            dn_meta=dn_meta)
    finally:
        head.assigner = assigner
    for key in batched:
        torch.testing.assert_close(
            batched[key], per_image[key], rtol=1e-5, atol=1e-7, msg=key)


def test_configs_use_the_batched_assigner():
    """The shipped RT-DETR configs (the zoo's common model base and the
    tiny one the multi-rank tests train) name BatchedHungarianAssigner."""
    from mmengine.config import Config
    from .rtdetr_utils import tiny_rtdetr_cfg
    for model in (Config.fromfile(R18VD_CONFIG).model, tiny_rtdetr_cfg()):
        assert model.train_cfg.assigner.type == 'BatchedHungarianAssigner'
