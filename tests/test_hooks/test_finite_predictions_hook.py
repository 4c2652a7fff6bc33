"""FinitePredictionsHook: NaN predictions through mmdet's CocoMetric
(pycocotools), a real Runner val run, and the sum over real gloo ranks."""
import logging
import os.path as osp
from types import SimpleNamespace

import pytest
import torch
from mmengine.evaluator import Evaluator
from mmengine.logging import MMLogger
from mmengine.structures import InstanceData

from mmddp_ext.hooks import FinitePredictionsHook
from mmddp_ext.runner.ext_runner import ExtRunner
from mmddp_ext.testing import run_on_ranks
from ..helpers import (TINY_CONFIG, ToyModel, build_runner, gt_as_predictions,
                       rank0_log)

NAN = float('nan')
# Measured with pycocotools 2.0 through mmdet 3.3's CocoMetric on the
# session's 8 val images (6 with boxes): a NaN box overlaps a GT box with
# a NaN IoU, which COCOeval.evaluateImg takes as a match. CocoMetric
# rounds to 3 decimals.
ALL_NAN_MAP = 0.094  # 3 NaN boxes per image, nothing else
MIXED_MAP = 0.594  # 3 NaN boxes per image ranked above the GT boxes


def _coco_evaluator(ann_file):
    """The tiny config's test evaluator (CocoMetric), as tools/test.py
    builds it, in an mmengine Evaluator."""
    from mmdet.registry import METRICS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    cfg = Config.fromfile(TINY_CONFIG)
    evaluator = Evaluator(
        METRICS.build(dict(cfg.test_evaluator, ann_file=ann_file)))
    evaluator.dataset_meta = dict(
        classes=cfg.test_dataloader.dataset.metainfo['classes'])
    return evaluator


def _det_samples(samples):
    """``gt_as_predictions`` dicts as the DetDataSamples a model returns."""
    from mmdet.structures import DetDataSample
    out = []
    for sample in samples:
        det = DetDataSample(
            metainfo=dict(
                img_id=sample['img_id'], ori_shape=sample['ori_shape']))
        det.pred_instances = InstanceData(**sample['pred_instances'])
        out.append(det)
    return out


def _with_nan_boxes(samples, per_image=3, keep_gt=True):
    """Each image gets ``per_image`` NaN boxes with score 1, ranked before
    its GT-as-prediction boxes (whose score drops to 0.9)."""
    for sample in samples:
        pred = sample['pred_instances']
        bboxes = torch.full((per_image, 4), NAN)
        scores = torch.ones(per_image)
        labels = torch.zeros(per_image, dtype=torch.long)
        if keep_gt:
            bboxes = torch.cat([bboxes, pred['bboxes']])
            scores = torch.cat([scores, pred['scores'] * 0.9])
            labels = torch.cat([labels, pred['labels']])
        sample['pred_instances'] = dict(
            bboxes=bboxes, scores=scores, labels=labels)
    return samples


def _evaluate(ann_file, samples, hook=None, batch_size=3):
    """One val epoch's evaluation, as ValLoop runs it: the hook's epoch
    start, ``evaluator.process`` per batch, ``evaluate``, the epoch end."""
    evaluator = _coco_evaluator(ann_file)
    runner = SimpleNamespace(val_loop=SimpleNamespace(evaluator=evaluator))
    if hook is not None:
        hook.before_val_epoch(runner)
    samples = _det_samples(samples)
    for start in range(0, len(samples), batch_size):
        evaluator.process(
            data_samples=samples[start:start + batch_size], data_batch={})
    metrics = evaluator.evaluate(len(samples))
    if hook is not None:
        hook.after_val_epoch(runner, metrics)
    assert 'process' not in vars(evaluator)  # the class method again
    return metrics


@pytest.fixture
def warnings_logged():
    """The messages logged at WARNING through the current MMLogger."""
    records = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = MMLogger.get_current_instance()
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_nan_boxes_are_scored_as_misses_through_coco_metric(
        synthetic_root, warnings_logged):
    ann_file = osp.join(synthetic_root, 'val', 'annotations.json')
    num_images = len(gt_as_predictions(ann_file))
    num_gt = sum(
        len(s['pred_instances']['scores'])
        for s in gt_as_predictions(ann_file))

    # GT boxes plus NaN boxes ranked above them: with the hook only the GT
    # boxes count (mAP 1.0); stock pycocotools matches the NaN boxes first
    # and the GT boxes become false positives.
    hook = FinitePredictionsHook()
    mixed = _evaluate(ann_file, _with_nan_boxes(gt_as_predictions(ann_file)),
                      hook)
    assert mixed['coco/bbox_mAP'] == 1.0
    assert hook.last_counts == dict(
        predictions=3 * num_images + num_gt,
        non_finite=3 * num_images,
        images=num_images,
        affected_images=num_images)
    assert len(warnings_logged) == 1
    assert (f'FinitePredictionsHook: {3 * num_images} of '
            f'{3 * num_images + num_gt} val predictions on {num_images} of '
            f'{num_images} images had non-finite bboxes/scores'
            ) in warnings_logged[0]
    assert 'diverged or its weights were never initialised' in (
        warnings_logged[0])
    stock = _evaluate(ann_file, _with_nan_boxes(gt_as_predictions(ann_file)))
    assert stock['coco/bbox_mAP'] == MIXED_MAP  # NaN boxes took matches

    # Only NaN boxes: a broken model scores 0.0 (all metric keys kept)
    # with the hook; stock pycocotools gives it an mAP above 0.
    broken = _evaluate(
        ann_file, _with_nan_boxes(gt_as_predictions(ann_file), keep_gt=False),
        FinitePredictionsHook())
    assert broken['coco/bbox_mAP'] == 0.0
    assert broken.keys() == mixed.keys()
    stock = _evaluate(
        ann_file, _with_nan_boxes(gt_as_predictions(ann_file), keep_gt=False))
    assert stock['coco/bbox_mAP'] == ALL_NAN_MAP


def test_dropping_them_instead_would_leave_no_metric(synthetic_root):
    """Why the hook zeroes non-finite predictions rather than dropping
    them: with every prediction dropped, CocoMetric returns no key at all
    (no mAP in the log) instead of the 0.0 a broken model deserves."""
    ann_file = osp.join(synthetic_root, 'val', 'annotations.json')
    samples = _with_nan_boxes(gt_as_predictions(ann_file), keep_gt=False)
    for sample in samples:
        sample['pred_instances'] = {
            key: value[:0]
            for key, value in sample['pred_instances'].items()
        }
    assert _evaluate(ann_file, samples) == {}


def test_finite_predictions_are_untouched_and_nothing_is_logged(
        synthetic_root, warnings_logged):
    ann_file = osp.join(synthetic_root, 'val', 'annotations.json')
    hook = FinitePredictionsHook()
    metrics = _evaluate(ann_file, gt_as_predictions(ann_file), hook)
    assert metrics['coco/bbox_mAP'] == 1.0
    assert hook.last_counts['non_finite'] == 0
    assert hook.last_counts['predictions'] > 0
    assert warnings_logged == []


def test_non_finite_scores_and_other_prediction_sets():
    """A NaN/inf score marks the prediction as a NaN box does; every
    ``pred_*`` set is checked, GT is not; the caller's tensors are kept."""
    from mmdet.structures import DetDataSample
    boxes = torch.tensor([[1., 2., 3., 4.], [5., 6., 7., 8.]])
    scores = torch.tensor([0.5, float('inf')])
    sample = DetDataSample()
    sample.pred_instances = InstanceData(
        bboxes=boxes, scores=scores, labels=torch.tensor([0, 1]))
    sample.pred_track_instances = InstanceData(
        bboxes=torch.tensor([[NAN, 0., 1., 1.]]), scores=torch.ones(1))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[NAN, 0., 1., 1.]]))
    hook = FinitePredictionsHook()
    hook.correct([sample])
    assert sample.pred_instances.bboxes.tolist() == [[1., 2., 3., 4.],
                                                     [0., 0., 0., 0.]]
    assert sample.pred_instances.scores.tolist() == [0.5, 0.0]
    assert sample.pred_instances.labels.tolist() == [0, 1]
    assert sample.pred_track_instances.bboxes.tolist() == [[0.] * 4]
    assert torch.isnan(sample.gt_instances.bboxes).any()
    assert torch.isinf(scores).any()  # a new tensor was set, not written
    # With fields=('bboxes',) the infinite score is not looked at.
    hook = FinitePredictionsHook(fields=['bboxes'])
    sample.pred_instances.scores = scores
    hook.correct([sample])
    assert torch.isinf(sample.pred_instances.scores).any()


def test_a_failed_epoch_leaves_no_patch_behind():
    evaluator = Evaluator([])
    runner = SimpleNamespace(test_loop=SimpleNamespace(evaluator=evaluator))
    hook = FinitePredictionsHook()
    hook.before_test_epoch(runner)
    assert 'process' in vars(evaluator)
    # The epoch raised: no after_test_epoch. The next epoch wraps the
    # class method once, not the old wrapper.
    hook.before_test_epoch(runner)
    assert vars(evaluator)['process'].__wrapped__ == evaluator.__class__.\
        process.__get__(evaluator)
    hook.after_test_epoch(runner)
    assert 'process' not in vars(evaluator)


@pytest.mark.parametrize('fields, error, message', [
    ('bboxes', TypeError, "fields must be a list or tuple.*'bboxes' \\(str"),
    (None, TypeError, 'fields must be a list or tuple.*None'),
    ((), ValueError, 'fields must name at least one.*\\(\\)'),
    (['bboxes', ''], ValueError, "fields must name at least one.*''"),
])
def test_bad_arguments_name_the_key(fields, error, message):
    with pytest.raises(error, match=message):
        FinitePredictionsHook(fields=fields)


# ---------------------------------------------------- ExtRunner switch
def _ext_runner(tmp_path, custom_hooks=None, **cfg):
    return ExtRunner(
        model=ToyModel(),
        work_dir=str(tmp_path),
        cfg=cfg,
        custom_hooks=custom_hooks)


def _finite_hooks(runner):
    return [h for h in runner.hooks if isinstance(h, FinitePredictionsHook)]


def test_ext_runner_switches_the_hook_on_by_default(tmp_path):
    assert len(_finite_hooks(_ext_runner(tmp_path / 'a'))) == 1
    assert _finite_hooks(
        _ext_runner(
            tmp_path / 'b',
            mmddp_ext_cfg=dict(finite_predictions=False))) == []
    # Listed in the config: that hook, with its arguments, and no other.
    listed = _finite_hooks(
        _ext_runner(
            tmp_path / 'c',
            custom_hooks=[
                dict(type='FinitePredictionsHook', fields=['bboxes'])
            ]))
    assert [h.fields for h in listed] == [('bboxes', )]
    with pytest.raises(
            TypeError,
            match="mmddp_ext_cfg.finite_predictions must be "
            "True.*'yes' \\(str\\)"):
        _ext_runner(
            tmp_path / 'd', mmddp_ext_cfg=dict(finite_predictions='yes'))


# ------------------------------------------------ a real Runner val run
def _val_with_nan_boxes(work_dir, data_root, overrides):
    """The tiny DINO, initialised, with NaN regression weights (as after a
    diverged step): every predicted box is NaN, every score finite."""
    runner = build_runner(work_dir, data_root, 1, overrides, launcher='none')
    runner.model.init_weights()
    with torch.no_grad():
        for param in runner.model.bbox_head.reg_branches.parameters():
            param.fill_(NAN)
    return runner, runner.val()


def test_runner_val_of_a_diverged_dino(tmp_path, synthetic_root):
    work_dir = str(tmp_path / 'stack')
    runner, metrics = _val_with_nan_boxes(work_dir, synthetic_root, {})
    assert metrics['coco/bbox_mAP'] == 0.0
    log = rank0_log(work_dir)
    assert 'WARNING - FinitePredictionsHook: ' in log
    assert 'val predictions on 8 of 8 images had non-finite' in log
    # TestLoop (the same 8 images) goes through the same wrapper.
    assert runner.test()['coco/bbox_mAP'] == 0.0
    assert 'test predictions on 8 of 8 images' in rank0_log(work_dir)

    # Negative control: the key off gives the stock, inflated mAP.
    work_dir = str(tmp_path / 'stock')
    _, metrics = _val_with_nan_boxes(
        work_dir, synthetic_root, {'mmddp_ext_cfg.finite_predictions': False})
    assert metrics['coco/bbox_mAP'] > 0.0  # 0.072 measured
    assert 'FinitePredictionsHook' not in rank0_log(work_dir)


# ------------------------------------------------- sums over gloo ranks
def _count_on_rank():
    """Rank r sees r + 1 NaN boxes among 4 predictions on one image, and
    one image without any NaN."""
    import torch.distributed as dist
    from mmdet.structures import DetDataSample
    rank = dist.get_rank()
    evaluator = Evaluator([])
    runner = SimpleNamespace(val_loop=SimpleNamespace(evaluator=evaluator))
    hook = FinitePredictionsHook()
    hook.before_val_epoch(runner)
    samples = []
    for num_nan in (rank + 1, 0):
        sample = DetDataSample()
        bboxes = torch.ones(4, 4)
        bboxes[:num_nan, 2] = NAN
        sample.pred_instances = InstanceData(
            bboxes=bboxes, scores=torch.ones(4))
        samples.append(sample)
    evaluator.process(data_samples=samples)
    hook.after_val_epoch(runner, {})
    return hook.last_counts


def test_counts_are_summed_over_gloo_ranks():
    results = run_on_ranks(_count_on_rank, 2, timeout=60)
    expected = dict(
        predictions=16, non_finite=1 + 2, images=4, affected_images=2)
    assert results == [expected, expected]
