"""The places of the ports that need full precision under autocast upcast
themselves (``torch.autocast('cpu', dtype=torch.float16)``; the
two-rank runs are in test_amp_families.py):

- the Hungarian matching of every DETR head (``DDPSafeDINOHead``'s, which
  DINO and CO-DINO use, RT-DETR's batched one, D-FINE's and DEIM's):
  a confident classifier's float16 sigmoid is 1, and boxes of 300 px have
  float16 areas of inf; with ``_matching_inputs`` switched off (the
  negative control) scipy refuses the cost matrix;
- D-FINE's distillation loss (DDF) between identical distributions is 0
  under float16 autocast as in float32 (the softmaxes run in float32).
"""
import pytest
import torch
from mmengine.structures import InstanceData

from mmddp_ext.models.dense_heads import DDPSafeDINOHead

SIDE = 640  # pixels: box areas above float16's largest value, 65504
NUM_QUERIES = 20
# float16 rounds sigmoid(x) to exactly 1 above x = 8.3.
CONFIDENT_LOGIT = 9.0


def _predictions(num_classes=2, batch=1):
    """Confident float16 logits and float16 normalized (cx, cy, w, h)
    boxes of about 300 px."""
    gen = torch.Generator().manual_seed(0)
    scores = CONFIDENT_LOGIT + torch.rand(
        batch, NUM_QUERIES, num_classes, generator=gen)
    centres = 0.3 + 0.4 * torch.rand(batch, NUM_QUERIES, 2, generator=gen)
    sizes = 0.4 + 0.2 * torch.rand(batch, NUM_QUERIES, 2, generator=gen)
    return scores.half(), torch.cat([centres, sizes], -1).half()


def _gt(batch=1):
    boxes = torch.tensor([[100., 120., 420., 400.], [300., 280., 600., 610.]])
    return [
        InstanceData(bboxes=boxes, labels=torch.tensor([0, 1]))
        for _ in range(batch)
    ], [dict(img_shape=(SIDE, SIDE)) for _ in range(batch)]


def _dino_head():
    from ..test_models.dino_utils import build_model, tiny_dino_cfg
    return build_model(tiny_dino_cfg()).bbox_head


def _rtdetr_head():
    from ..test_projects.test_rtdetr.rtdetr_utils import build_tiny
    return build_tiny().bbox_head


def _dfine_head():
    from ..test_projects.test_dfine.dfine_utils import build_tiny
    return build_tiny().bbox_head


def _match_dino(head, scores, boxes):
    gts, metas = _gt()
    result = head._get_targets_single(scores[0], boxes[0], gts[0], metas[0])
    labels, _, _, _, pos_inds, _ = result
    return pos_inds.tolist(), labels[pos_inds].tolist()


def _match_rtdetr(head, scores, boxes):
    gts, metas = _gt()
    gt = head._batch_gt(gts, metas, scores.device)
    queries, targets = head._match([scores], [boxes], gt, gts, metas)[0]
    return queries.tolist(), targets.tolist()


def _match_dfine(head, scores, boxes):
    gts, metas = _gt()
    (queries, targets), = head._match(scores, boxes, gts, metas)
    return queries.tolist(), targets.tolist()


HEADS = {
    'dino': (_dino_head, _match_dino),
    'rtdetr': (_rtdetr_head, _match_rtdetr),
    'dfine': (_dfine_head, _match_dfine),
}


@pytest.mark.parametrize('kind', sorted(HEADS))
def test_matching_under_float16_autocast_is_float32_matching(kind):
    build, match = HEADS[kind]
    head = build()
    scores, boxes = _predictions()
    reference = match(head, scores.float(), boxes.float())
    with torch.autocast('cpu', dtype=torch.float16):
        assert match(head, scores, boxes) == reference
    assert len(reference[0]) == 2  # both GT matched


@pytest.mark.parametrize('kind', sorted(HEADS))
def test_float16_matching_is_refused_by_scipy(kind, monkeypatch):
    """Negative control: the predictions reach the costs in float16."""
    build, match = HEADS[kind]
    head = build()
    monkeypatch.setattr(
        DDPSafeDINOHead, '_matching_inputs', lambda self, cls_score, bbox_pred:
        (cls_score, bbox_pred))
    scores, boxes = _predictions()
    with torch.autocast('cpu', dtype=torch.float16):
        with pytest.raises(
                ValueError, match='matrix contains invalid numeric entries'):
            match(head, scores, boxes)


def test_distillation_of_identical_distributions_is_zero_in_float16():
    """D-FINE's layers start with identical edge distributions; their DDF
    is 0 in float32, up to its rounding (2e-7 here). Its softmaxes in
    float16 (CPU autocast leaves them in the input dtype, CUDA autocast
    does not) made it about 1e-3: the control computes that from the same
    logits."""
    import torch.nn.functional as F

    from ..test_projects.test_dfine.dfine_utils import import_project
    loss = import_project().DecoupledDistillationFocalLoss()
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(64, 33, generator=gen)).half()
    ones = torch.ones(64)
    matched = torch.arange(64) % 2 == 0
    with torch.autocast('cpu', dtype=torch.float16):
        value = loss(logits, logits.clone(), ones, matched, 32., 32., 1., 1.)
    reference = loss(logits.float(), logits.float(), ones, matched, 32., 32.,
                     1., 1.)
    assert value.dtype == torch.float32
    assert abs(value.item()) < 1e-6
    assert value.item() == pytest.approx(reference.item(), abs=1e-9)
    control = F.kl_div(
        F.log_softmax(logits / 5, dim=1),
        F.softmax(logits / 5, dim=1),
        reduction='none').sum(-1).abs().mean() * 25
    assert control.item() > 1e-4


def _co_dino():
    from ..test_projects.test_codetr.codetr_utils import (build_tiny,
                                                          tiny_model_cfg)
    cfg = tiny_model_cfg()
    cfg.backbone.base_channels = 32
    cfg.neck.in_channels = [64, 128, 256]
    return build_tiny(cfg)


def _co_dino_inputs(side=96):
    """Float16 features of CO-DINO-tiny's four levels (strides 8-64, as
    its query head hands them to the auxiliary heads) and one sample."""
    from mmdet.structures import DetDataSample
    gen = torch.Generator().manual_seed(0)
    feats = tuple(
        torch.randn(1, 128, side // stride, side //
                    stride, generator=gen).half()
        for stride in (8, 16, 32, 64))
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(side, side),
            batch_input_shape=(side, side),
            pad_shape=(side, side),
            scale_factor=(1.0, 1.0)))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[10., 12., 60., 70.]]), labels=torch.tensor([0]))
    return feats, [sample]


def test_co_dino_rpn_on_float16_features_stops_in_nms():
    """Negative control of CoDETR.loss's float32 RPN: MMDetection's
    ``loss_and_predict`` under autocast, as CoDETR called it, on the
    float16 features the query head gives, stops in mmcv's NMS (CO-DINO
    could not train one step under autocast); test_amp_families.py trains
    CO-DINO through the port's call."""
    model = _co_dino()
    feats, samples = _co_dino_inputs()
    proposal_cfg = model.train_cfg[model.head_idx].get('rpn_proposal')
    with torch.autocast('cpu', dtype=torch.float16):
        with pytest.raises(
                RuntimeError, match='expected scalar type Float but found '
                'Half'):
            model.rpn_head.loss_and_predict(
                feats, samples, proposal_cfg=proposal_cfg)


def test_co_dino_roi_features_are_float32_under_autocast():
    """The RoI head samples float32 features (as upstream's ``force_fp32``
    extractor); MMDetection 3.x's ``_bbox_forward`` (the control) samples
    the float16 ones."""
    from mmdet.models.roi_heads import StandardRoIHead
    head = _co_dino().roi_head[0]
    feats, _ = _co_dino_inputs()
    rois = torch.tensor([[0., 10., 12., 60., 70.]])
    with torch.autocast('cpu', dtype=torch.float16):
        port = head._bbox_forward(feats, rois)
        stock = StandardRoIHead._bbox_forward(head, feats, rois)
    assert port['bbox_feats'].dtype == torch.float32
    assert stock['bbox_feats'].dtype == torch.float16


def test_full_precision_upcasts_reduced_dtypes_only():
    """The upcasts keep float64 (the ports' equivalence runs with upstream
    are in float64; ``.float()`` would round them to float32)."""
    from mmddp_ext.utils import full_precision
    for dtype, expected in ((torch.float16, torch.float32),
                            (torch.bfloat16, torch.float32),
                            (torch.float32, torch.float32),
                            (torch.float64, torch.float64)):
        assert full_precision(torch.ones(2, dtype=dtype)).dtype == expected
