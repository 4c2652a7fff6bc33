"""DEIMv2's criterion options on a tiny head with constructed outputs:
``use_uni_set`` (the box terms of each output on its own matching or on
the union), ``losses`` without ``'local'`` (no FGL / DDF computed), the
matcher change (the cost before and after ``matcher_change_epoch``
against the formulas computed here, the epoch given by
:class:`SetEpochHook`), the errors of wrong values; and, for the 12 COCO
configs, these options against those upstream's code builds from the
YAML (``data/upstream_recipes.json``, ``criterion``).

The constructed outputs make every matching known in advance: in each
image, decoder layer ``i`` puts query ``i`` exactly on the GT with a
confident class logit, layer 0's box output puts query 3 there, the
encoder output query 4; every other query is far away and unconfident.
"""
import copy
from types import SimpleNamespace

import pytest
import torch

from .deimv2_utils import SIZES, coco_meta_model, import_project
from .test_deimv2_recipes import records

NUM_LAYERS, NUM_QUERIES, NUM_CLASSES, REG_MAX = 3, 6, 3, 4
IMAGE = 100
GT_CXCYWH = (0.5, 0.5, 0.2, 0.2)
GT_LABEL = 1
# query on the GT in each output: layers 0..2, layer 0's box, encoder
ON_GT = {'layers': (0, 1, 2), 'pre': 3, 'enc': 4}
EARLY_COSTS = [
    dict(type='FocalLossCost', weight=2.0, alpha=0.25, gamma=2.0, eps=1e-8),
    dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
    dict(type='IoUCost', iou_mode='giou', weight=2.0)
]


def _assigner_cfg(**kwargs):
    return dict(
        type='DEIMv2HungarianAssigner', match_costs=EARLY_COSTS, **kwargs)


def _head(**kwargs):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    register_all_modules()
    import_project()
    return MODELS.build(
        dict(
            type='DEIMv2Head',
            num_classes=NUM_CLASSES,
            embed_dims=16,
            reg_max=REG_MAX,
            num_pred_layer=NUM_LAYERS + 1,
            as_two_stage=True,
            loss_bbox=dict(type='L1Loss', loss_weight=5.0),
            loss_iou=dict(type='GIoULoss', loss_weight=2.0),
            train_cfg=dict(
                assigner=_assigner_cfg(
                    change_matcher=True,
                    iou_order_alpha=4.0,
                    matcher_change_epoch=5)),
            test_cfg=dict(max_per_img=NUM_QUERIES),
            **kwargs))


def _far_boxes(num: int) -> torch.Tensor:
    """Small boxes along the bottom edge, far from the GT."""
    centres = 0.08 + 0.14 * torch.arange(num, dtype=torch.float64)
    return torch.stack([
        centres,
        torch.full_like(centres, 0.9),
        torch.full_like(centres, 0.06),
        torch.full_like(centres, 0.05)
    ], 1)


def _output(num: int, on_gt: int):
    """Logits and boxes of one output of one image: ``on_gt`` on the GT
    and confident, the others far and unconfident."""
    boxes = _far_boxes(num)
    boxes[on_gt] = torch.tensor(GT_CXCYWH, dtype=torch.float64)
    logits = torch.full((num, NUM_CLASSES), -5.0, dtype=torch.float64)
    logits[on_gt, GT_LABEL] = 5.0
    return logits, boxes


def _inputs(batch: int = 2):
    """``DFINEHead.loss`` arguments: one GT per image, one dn group (2
    queries: the GT's positive and negative)."""
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    num_dn = 2
    total = num_dn + NUM_QUERIES
    gen = torch.Generator().manual_seed(0)

    def per_image(on_gt):
        logits, boxes = _output(total, num_dn + on_gt)
        # dn queries: the positive on the GT, the negative far
        dn_logits, dn_boxes = _output(num_dn, 0)
        logits[:num_dn], boxes[:num_dn] = dn_logits, dn_boxes
        return logits, boxes

    def batched(on_gt):
        pairs = [per_image(on_gt) for _ in range(batch)]
        return (torch.stack([p[0] for p in pairs]),
                torch.stack([p[1] for p in pairs]))

    layers = [batched(q) for q in ON_GT['layers']]
    pre_scores, pre_boxes = batched(ON_GT['pre'])
    enc = [_output(NUM_QUERIES, ON_GT['enc']) for _ in range(batch)]
    samples = []
    cx, cy, w, h = GT_CXCYWH
    for _ in range(batch):
        sample = DetDataSample(
            metainfo=dict(img_shape=(IMAGE, IMAGE), ori_shape=(IMAGE, IMAGE)))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor(
                [[cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]],
                dtype=torch.float64) * IMAGE,
            labels=torch.tensor([GT_LABEL]))
        samples.append(sample)
    return dict(
        layers_scores=torch.stack([s for s, _ in layers]),
        layers_boxes=torch.stack([b for _, b in layers]),
        layers_corners=torch.randn(
            NUM_LAYERS,
            batch,
            total,
            4 * (REG_MAX + 1),
            generator=gen,
            dtype=torch.float64),
        ref_boxes=torch.tensor([0.5, 0.5, 0.3, 0.3],
                               dtype=torch.float64).expand(batch, total, 4),
        pre_scores=pre_scores,
        pre_boxes=pre_boxes,
        up=torch.tensor([0.5], dtype=torch.float64),
        reg_scale=torch.tensor([4.0], dtype=torch.float64),
        enc_outputs_class=torch.stack([s for s, _ in enc]),
        enc_outputs_coord=torch.stack([b for _, b in enc]),
        dn_meta=dict(num_denoising_queries=num_dn, num_denoising_groups=1),
        batch_data_samples=samples)


def _values(losses):
    return {k: float(v) for k, v in losses.items()}


def _union_l1(layer_boxes: torch.Tensor) -> float:
    """loss_bbox (weight 5) of one output on the union of the matchings:
    every query some output puts on the GT, divided by their count."""
    queries = sorted({*ON_GT['layers'], ON_GT['pre'], ON_GT['enc']})
    gt = torch.tensor(GT_CXCYWH, dtype=torch.float64)
    total = sum(
        (image[q] - gt).abs().sum() for image in layer_boxes for q in queries)
    return 5.0 * float(total) / (len(queries) * len(layer_boxes))


def test_use_uni_set_selects_the_matching_of_the_box_terms():
    """use_uni_set=False: each output's boxes on its own match (exactly on
    the GT: 0); True: on the union (the far queries too, as computed
    here). The classification terms are the same either way (their own
    matching)."""
    inputs = _inputs()
    own = _values(
        _head(losses=['mal', 'boxes'], use_uni_set=False).loss(**inputs))
    union = _values(
        _head(losses=['mal', 'boxes'], use_uni_set=True).loss(**inputs))
    assert set(own) == set(union)
    num_dn = inputs['dn_meta']['num_denoising_queries']
    for suffix, boxes in (('_aux_0', inputs['layers_boxes'][0]),
                          ('_aux_1', inputs['layers_boxes'][1]),
                          ('', inputs['layers_boxes'][2]),
                          ('_pre', inputs['pre_boxes'])):
        assert own['loss_bbox' + suffix] == pytest.approx(0.0, abs=1e-9)
        assert own['loss_giou' + suffix] == pytest.approx(0.0, abs=1e-6)
        expected = _union_l1(boxes[:, num_dn:])
        assert expected > 1.0
        assert union['loss_bbox' + suffix] == pytest.approx(expected), suffix
    assert own['loss_bbox_enc_0'] == pytest.approx(0.0, abs=1e-9)
    assert union['loss_bbox_enc_0'] == pytest.approx(
        _union_l1(inputs['enc_outputs_coord']))
    for key in own:
        if 'loss_mal' in key or '_dn_' in key:
            assert own[key] == pytest.approx(union[key], rel=1e-12), key


def test_losses_without_local_compute_no_fgl_or_ddf():
    """losses=['mal', 'boxes']: no FGL / DDF key, the FGL / DDF losses are
    never called, and every other term equals the full criterion's."""
    inputs = _inputs()
    full = _values(_head().loss(**inputs))
    assert any('fgl' in k for k in full) and any('ddf' in k for k in full)

    light = _head(losses=['boxes', 'mal'])

    def never(*args, **kwargs):
        raise AssertionError('the local loss was computed')

    light.loss_fgl.forward = never
    light.loss_ddf.forward = never
    values = _values(light.loss(**inputs))
    assert set(values) == {
        k
        for k in full if 'fgl' not in k and 'ddf' not in k
    }
    assert values == pytest.approx({k: full[k] for k in values}, rel=1e-12)


def _own_iou(a: torch.Tensor, b: torch.Tensor, generalised: bool):
    """(n, m) IoU or GIoU of xyxy boxes, from their definition."""
    area_a = ((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]))[:, None]
    area_b = ((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]))[None]
    low = torch.maximum(a[:, None, :2], b[None, :, :2])
    high = torch.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = (high - low).clamp(min=0).prod(-1)
    union = area_a + area_b - inter
    iou = inter / union
    if not generalised:
        return iou
    hull = (torch.maximum(a[:, None, 2:], b[None, :, 2:]) -
            torch.minimum(a[:, None, :2], b[None, :, :2])).prod(-1)
    return iou - (hull - union) / hull


def _matching_case():
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(1)
    xy = torch.rand(7, 2, generator=gen, dtype=torch.float64) * 60
    wh = 10 + torch.rand(7, 2, generator=gen, dtype=torch.float64) * 30
    boxes = torch.cat([xy, xy + wh], 1)
    preds = InstanceData(
        scores=torch.randn(5, NUM_CLASSES, generator=gen, dtype=torch.float64)
        * 2,
        bboxes=boxes[:5])
    gts = InstanceData(bboxes=boxes[5:], labels=torch.tensor([2, 0]))
    return preds, gts, dict(img_shape=(IMAGE, IMAGE))


def _cost(assigner, preds, gts, meta):
    return sum(c(preds, gts, meta) for c in assigner.match_costs)


def test_matcher_cost_before_and_after_the_change_epoch():
    """Before matcher_change_epoch: 2 focal + 5 L1 (normalised cx, cy, w,
    h) + 2 (-GIoU); from it on: -(p * IoU ** 4); both computed here from
    their definitions. Control: change_matcher=False keeps the first."""
    from mmdet.registry import TASK_UTILS
    head = _head()
    preds, gts, meta = _matching_case()
    p = preds.scores.sigmoid()[:, gts.labels]
    focal = (0.25 * (1 - p)**2 * -(p + 1e-8).log() -
             0.75 * p**2 * -(1 - p + 1e-8).log())

    def cxcywh(b):
        return torch.cat([(b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]],
                         1) / IMAGE

    l1 = (cxcywh(preds.bboxes)[:, None] -
          cxcywh(gts.bboxes)[None]).abs().sum(-1)
    giou = _own_iou(preds.bboxes, gts.bboxes, generalised=True)
    early = 2 * focal + 5 * l1 - 2 * giou
    late = -(p * _own_iou(preds.bboxes, gts.bboxes, False)**4)
    assert (late - early).abs().max() > 0.5

    head.set_epoch(4)
    assert torch.allclose(
        _cost(head.assigner, preds, gts, meta), early, atol=1e-12)
    head.set_epoch(5)
    assert torch.allclose(
        _cost(head.assigner, preds, gts, meta), late, atol=1e-12)
    head.set_epoch(4)  # a resume before the change epoch goes back
    assert torch.allclose(
        _cost(head.assigner, preds, gts, meta), early, atol=1e-12)

    unchanged = TASK_UTILS.build(
        _assigner_cfg(
            change_matcher=False, iou_order_alpha=4.0, matcher_change_epoch=5))
    unchanged.set_epoch(1000)
    assert torch.allclose(
        _cost(unchanged, preds, gts, meta), early, atol=1e-12)


def test_set_epoch_hook_changes_the_head_matching():
    """SetEpochHook gives the runner's epoch to the head's assigner: a
    query exactly on the GT but unsure (p 0.3) against a sure one at IoU
    0.6. D-FINE's cost takes the sure one, -(p * IoU^4) the exact one."""
    from mmengine.structures import InstanceData

    from projects.DEIM.deim.set_epoch_hook import SetEpochHook
    head = _head()
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), head)
    gt = torch.tensor([[40.0, 40.0, 60.0, 60.0]])
    # (45, 40, 65, 60): IoU 300 / 500 = 0.6 with the GT
    preds = InstanceData(
        scores=torch.tensor([[-9.0, torch.logit(torch.tensor(0.3)), -9.0],
                             [-9.0, 4.0, -9.0]]),
        bboxes=torch.cat([gt, gt + torch.tensor([5.0, 0.0, 5.0, 0.0])]))
    gts = InstanceData(bboxes=gt, labels=torch.tensor([1]))
    meta = dict(img_shape=(IMAGE, IMAGE))

    def matched_query(epoch):
        runner = SimpleNamespace(
            epoch=epoch,
            model=model,
            train_dataloader=SimpleNamespace(
                dataset=object(), persistent_workers=False))
        SetEpochHook().before_train_epoch(runner)
        assigned = head.assigner.assign(preds, gts, meta).gt_inds
        return int(torch.nonzero(assigned > 0)[0])

    assert matched_query(4) == 1
    assert matched_query(5) == 0
    assert head.assigner.epoch == 5


@pytest.mark.parametrize(
    'kwargs, match',
    [(dict(losses=['mal', 'local']), 'DEIMv2Head.losses'),
     (dict(losses='mal'), 'DEIMv2Head.losses'),
     (dict(use_uni_set=False), "use_uni_set=False needs losses without"),
     (dict(use_uni_set=1), 'use_uni_set must be True or False')])
def test_wrong_criterion_options_are_user_errors(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _head(**kwargs)


@pytest.mark.parametrize('kwargs, match', [
    (dict(matcher_change_epoch=-1), 'matcher_change_epoch must be'),
    (dict(iou_order_alpha=0), 'iou_order_alpha'),
    (dict(change_matcher='yes'), 'change_matcher must be'),
])
def test_wrong_matcher_options_are_user_errors(kwargs, match):
    from mmdet.registry import TASK_UTILS
    import_project()
    with pytest.raises((ValueError, TypeError), match=match):
        TASK_UTILS.build(_assigner_cfg(**kwargs))


def port_criterion(model) -> dict:
    """The criterion options of a built DEIMv2, in the records' layout
    (weights of the terms it computes only)."""
    head = model.bbox_head
    assigner = head.assigner
    costs = {type(c).__name__: c for c in assigner.early_costs}
    focal, l1, iou = (costs['FocalLossCost'], costs['BBoxL1Cost'],
                      costs['IoUCost'])
    weights = dict(
        loss_mal=head.loss_cls.loss_weight,
        loss_bbox=head.loss_bbox.loss_weight,
        loss_giou=head.loss_iou.loss_weight)
    if 'local' in head.losses:
        weights.update(
            loss_fgl=head.loss_fgl.loss_weight,
            loss_ddf=head.loss_ddf.loss_weight)
    return dict(
        losses=sorted(head.losses),
        use_uni_set=head.use_uni_set,
        weights=weights,
        gamma=head.loss_cls.gamma,
        matcher=dict(
            cost_class=focal.weight,
            alpha=focal.alpha,
            gamma=focal.gamma,
            cost_bbox=l1.weight,
            cost_giou=iou.weight if iou.iou_mode == 'giou' else None,
            change_matcher=assigner.change_matcher,
            iou_order_alpha=assigner.iou_order_alpha,
            matcher_change_epoch=assigner.matcher_change_epoch))


def upstream_criterion(record: dict) -> dict:
    """The same options from a record of upstream's ``DEIMCriterion``."""
    options = record['criterion']
    matcher = options['matcher']
    terms = {
        'mal': ['loss_mal'],
        'boxes': ['loss_bbox', 'loss_giou'],
        'local': ['loss_fgl', 'loss_ddf']
    }
    assert matcher['use_focal_loss']
    return dict(
        losses=sorted(options['losses']),
        use_uni_set=options['use_uni_set'],
        weights={
            key: options['weight_dict'][key]
            for loss in options['losses']
            for key in terms[loss]
        },
        gamma=options['gamma'],
        matcher={
            key: matcher[key]
            for key in ('cost_class', 'alpha', 'gamma', 'cost_bbox',
                        'cost_giou', 'change_matcher', 'iou_order_alpha',
                        'matcher_change_epoch')
        })


@pytest.mark.parametrize('size', SIZES)
def test_criterion_options_equal_upstream(size):
    """Each COCO config's criterion (losses, use_uni_set, term weights,
    MAL gamma, matching costs, the matcher change) equals the one
    upstream's code builds from its YAML (``data/upstream_recipes.json``,
    ``criterion``)."""
    _, model = coco_meta_model(size)
    assert port_criterion(model) == upstream_criterion(records()[size])


def test_a_changed_criterion_option_shows():
    """Control: Atto built with the other sizes' union matching, or with
    the matcher change at epoch 45, differs from upstream's Atto."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    cfg, _ = coco_meta_model('hgnetv2_atto')
    register_all_modules()
    theirs = upstream_criterion(records()['hgnetv2_atto'])
    for change, key in ((dict(bbox_head=dict(
            use_uni_set=True)), 'use_uni_set'), (dict(
                train_cfg=dict(assigner=dict(matcher_change_epoch=45))),
                                                 'matcher')):
        changed = copy.deepcopy(cfg)  # the cached config stays as it is
        changed.merge_from_dict({'model': change})
        with torch.device('meta'):
            ours = port_criterion(MODELS.build(changed.model))
        assert {k for k in ours if ours[k] != theirs[k]} == {key}
