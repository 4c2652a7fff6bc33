import functools
import logging
from typing import Any, Dict, Optional, Sequence

import numpy as np
import torch
from mmengine.dist import all_reduce
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from mmengine.structures import BaseDataElement, InstanceData

# Order of the per-rank counters in the all-reduced tensor.
COUNT_NAMES = ('predictions', 'non_finite', 'images', 'affected_images')
DEFAULT_FIELDS = ('bboxes', 'scores')
PREDICTION_PREFIX = 'pred_'
_NO_PATCH = object()


def _rows_finite(value: Any) -> Optional[torch.Tensor]:
    """Per row of ``value`` (a tensor, array or box type with ``.tensor``),
    whether all its numbers are finite; None for any other type."""
    value = getattr(value, 'tensor', value)
    if isinstance(value, np.ndarray):
        value = torch.from_numpy(value)
    if not isinstance(value, torch.Tensor) or value.dim() == 0:
        return None
    if not value.is_floating_point():
        return torch.ones(len(value), dtype=torch.bool)
    finite = torch.isfinite(value.detach().cpu())
    return finite.flatten(1).all(dim=1) if finite.dim() > 1 else finite


def _zeroed(value: Any, rows: torch.Tensor) -> Any:
    """A copy of ``value`` whose ``rows`` are 0 (the input is left as it
    is: other hooks may hold it)."""
    value = value.copy() if isinstance(value, np.ndarray) else value.clone()
    target = getattr(value, 'tensor', value)
    if isinstance(target, np.ndarray):
        target[rows.cpu().numpy()] = 0
    else:
        target[rows.to(target.device)] = 0
    return value


def _prediction_sets(sample: Any):
    """The prediction sets of a data sample: its ``pred_*`` fields that hold
    per-instance data (``InstanceData`` or a dict)."""
    if not isinstance(sample, (BaseDataElement, dict)):
        return
    for key, value in sample.items():
        if key.startswith(PREDICTION_PREFIX) and isinstance(
                value, (InstanceData, dict)):
            yield value


@HOOKS.register_module()
class FinitePredictionsHook(Hook):
    """Score non-finite predictions as misses in validation and testing.

    A model that diverged, or whose weights were never initialised,
    predicts NaN boxes; COCO evaluation (pycocotools) counts a NaN IoU as
    a match, so such a model gets a bbox mAP above 0 (0.094 on the
    synthetic dataset with three NaN boxes per image) and looks weakly
    trained rather than broken.

    ``ValLoop``/``TestLoop.run_iter`` hand the outputs to
    ``evaluator.process`` before ``after_val_iter``/``after_test_iter``, so
    a hook cannot reach them in time. This hook therefore wraps the
    ``process`` method of the loop's evaluator instance from
    ``before_val_epoch``/``before_test_epoch`` until the matching
    ``after_*_epoch``, where the method is restored. The wrapper differs
    from ``Evaluator.process`` in one step before it: in every
    ``pred_*`` field of each data sample that holds per-instance data
    (``InstanceData`` or a dict, such as ``pred_instances``), each
    prediction with a non-finite number in any of ``fields`` gets 0 in
    all of them, i.e. a zero-size box at the origin, which overlaps no
    box, with score 0, ranked after every real prediction. Such a
    prediction is a miss, so an all-NaN model scores mAP 0.0 while the
    metric keys stay (dropping the predictions instead would leave a
    metric such as ``CocoMetric`` with nothing to score: it returns no keys
    at all, so the log shows no mAP and ``CheckpointHook(save_best=...)``
    skips that evaluation, instead of a plain 0). Finite
    predictions are scored exactly as before. The data samples get the
    corrected fields, so every metric of the evaluator (``DumpDetResults``
    too) and the hooks after it (visualisation) see what was scored.

    At the end of each validation or test epoch the counts of all ranks
    are summed (every rank runs the loop to its end), so every rank, rank
    0 whose log MMEngine shows included, logs the same one warning when any
    prediction was non-finite. The sums are kept in :attr:`last_counts`.

    Args:
        fields (Sequence[str]): The per-instance fields that must be
            finite; a field a prediction set lacks is skipped. Defaults
            to ``('bboxes', 'scores')``.

    Attributes:
        last_counts (dict): After a validation or test epoch, the sums over
            ranks: ``predictions`` seen, ``non_finite`` among them,
            ``images`` seen and ``affected_images`` with at least one
            non-finite prediction.
    """

    priority = 'NORMAL'  # warn before LoggerHook prints the metrics

    def __init__(self, fields: Sequence[str] = DEFAULT_FIELDS) -> None:
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise TypeError(
                'FinitePredictionsHook: fields must be a list or tuple of '
                "field names such as ('bboxes', 'scores'), but got "
                f'{fields!r} ({type(fields).__name__}).')
        if not fields or not all(
                isinstance(name, str) and name for name in fields):
            raise ValueError(
                'FinitePredictionsHook: fields must name at least one '
                "per-instance field, e.g. ('bboxes', 'scores'), but got "
                f'{fields!r}.')
        self.fields = tuple(fields)
        self.last_counts: Dict[str, int] = {}
        self._counts = dict.fromkeys(COUNT_NAMES, 0)
        self._patched = None  # (evaluator, its own 'process' or _NO_PATCH)

    def before_val_epoch(self, runner) -> None:
        self._patch(runner.val_loop)

    def before_test_epoch(self, runner) -> None:
        self._patch(runner.test_loop)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self._finish('val')

    def after_test_epoch(self, runner, metrics=None) -> None:
        self._finish('test')

    def correct(self, data_samples: Sequence) -> None:
        """Zero the non-finite predictions of ``data_samples`` in place
        (each prediction set gets new tensors) and count them."""
        counts = self._counts
        for sample in data_samples:
            affected = False
            for predictions in _prediction_sets(sample):
                affected |= self._correct_set(predictions)
            counts['images'] += 1
            counts['affected_images'] += affected

    def _correct_set(self, predictions) -> bool:
        checked = {}  # the per-instance fields and their values
        finite = None
        for name in self.fields:
            value = predictions.get(name)
            rows = None if value is None else _rows_finite(value)
            if rows is None:
                continue
            if finite is not None and len(rows) != len(finite):
                return False  # not per-instance data after all
            checked[name] = value
            finite = rows if finite is None else finite & rows
        if finite is None:
            return False
        self._counts['predictions'] += len(finite)
        bad = ~finite
        num_bad = int(bad.sum())
        if not num_bad:
            return False
        self._counts['non_finite'] += num_bad
        for name, value in checked.items():
            zeroed = _zeroed(value, bad)
            if isinstance(predictions, dict):
                predictions[name] = zeroed
            else:
                setattr(predictions, name, zeroed)
        return True

    def _patch(self, loop) -> None:
        self._restore()  # an epoch that raised left its patch behind
        self._counts = dict.fromkeys(COUNT_NAMES, 0)
        evaluator = getattr(loop, 'evaluator', None)
        process = getattr(evaluator, 'process', None)
        if process is None:
            print_log(
                f'FinitePredictionsHook: {type(loop).__name__} has no '
                'evaluator with a process method; predictions are not '
                'checked.',
                logger='current')
            return

        @functools.wraps(process)
        def process_finite(data_samples, data_batch=None):
            self.correct(data_samples)
            return process(data_samples=data_samples, data_batch=data_batch)

        self._patched = (evaluator,
                         evaluator.__dict__.get('process', _NO_PATCH))
        evaluator.process = process_finite

    def _restore(self) -> None:
        if self._patched is None:
            return
        evaluator, own = self._patched
        if own is _NO_PATCH:
            evaluator.__dict__.pop('process', None)
        else:
            evaluator.process = own
        self._patched = None

    def _finish(self, mode: str) -> None:
        self._restore()
        local = torch.tensor([self._counts[name] for name in COUNT_NAMES],
                             dtype=torch.int64)
        all_reduce(local)  # a no-op outside a process group
        counts = dict(zip(COUNT_NAMES, (int(v) for v in local.tolist())))
        self.last_counts = counts
        if not counts['non_finite']:
            return
        print_log(
            f'FinitePredictionsHook: {counts["non_finite"]} of '
            f'{counts["predictions"]} {mode} predictions on '
            f'{counts["affected_images"]} of {counts["images"]} images had '
            f'non-finite {"/".join(self.fields)} (all ranks); they were '
            'scored as misses (a zero-size box with score 0), because '
            'COCO evaluation counts a NaN box as a match and reports an mAP '
            'above 0 for a broken model. This usually means the model '
            'diverged or its weights were never initialised or loaded: '
            'check the training loss for NaN, lower the learning rate (or '
            'clip gradients), or load trained weights (load_from, or the '
            'checkpoint argument of tools/test.py).',
            logger='current',
            level=logging.WARNING)
