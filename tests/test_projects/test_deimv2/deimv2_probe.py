"""Test-only components for the DEIMv2 DDP runs (``test_deimv2_dist.py``),
loaded through a run's ``custom_imports`` next to
``test_dfine/ddp_probe.py``'s ``GradientRecordHook`` and
``test_deim/deim_probe.py``'s ``ResumeRecordHook``:

- ``DEIMv2RecipeRecordHook`` writes, per rank, what the DEIMv2 recipe did
  epoch by epoch on that rank: the wrapper and the train loader's workers,
  the matcher's cost and the matchings made with GT under each cost, the
  Copy-Blend and MixUp calls (and the boxes Copy-Blend pasted), the
  samples the data workers resized from a shape other than the image's
  own (the zoom-out / IoU crop of the policy ran), the process ids of the
  data workers that loaded the epoch (the same ids again: persistent
  workers kept; new ones: restarted), and each iteration's total loss;
- ``UpstreamEmptyDnLosses`` is a head mixin for the negative control:
  upstream DEIMv2's criterion on a batch without dn queries (no
  ``dn_outputs``: no dn loss terms);
- ``DEIMv2UpstreamEmptyDn`` / ``DEIMv2UpstreamEmptyDnHead``: the model
  with upstream DEIMv2's whole behaviour on a batch without GT (no dn
  queries, no dn loss terms), for configs (the doctor's control).
"""
import json
import os.path as osp

from mmdet.registry import MODELS
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from projects.DEIMv2.deimv2 import DEIMv2, DEIMv2Head, DEIMv2HungarianAssigner
from ..test_dfine.ddp_probe import _UpstreamEmptyDn


def _unwrapped(model):
    return model.module if is_model_wrapper(model) else model


def matchers(model) -> list:
    """The model's :class:`DEIMv2HungarianAssigner` instances, once each."""
    found = {}
    for module in model.modules():
        assigner = getattr(module, 'assigner', None)
        if isinstance(assigner, DEIMv2HungarianAssigner):
            found[id(assigner)] = assigner
    return list(found.values())


def resized_from_another_shape(sample) -> bool:
    """Whether the pipeline's ``Resize`` got an image of another shape than
    the file's (``ori_shape``): a zoom-out (``Expand``) or crop ran."""
    height, width = sample.metainfo['img_shape'][:2]
    scale_w, scale_h = sample.metainfo['scale_factor'][:2]
    ori_h, ori_w = sample.metainfo['ori_shape'][:2]
    return (round(width / scale_w) != ori_w
            or round(height / scale_h) != ori_h)


def worker_pids(loader) -> list:
    """Process ids of ``loader``'s running data workers, sorted; [] when
    it has none running (torch keeps a persistent-worker loader's
    iterator, and so its worker processes, in ``_iterator``)."""
    iterator = getattr(loader, '_iterator', None)
    return sorted(w.pid for w in getattr(iterator, '_workers', ()))


@HOOKS.register_module()
class DEIMv2RecipeRecordHook(Hook):
    """See the module docstring; writes ``recipe_record_rank{rank}.json``
    in the work dir after training. Runs after ``SetEpochHook`` (lowest
    priority), so an epoch's record holds the state that epoch trains
    with."""
    priority = 'LOWEST'

    def __init__(self):
        self.record = dict(epochs=[])
        self.epoch = None

    def before_train(self, runner) -> None:
        loader = runner.train_dataloader
        self.record.update(
            wrapper=type(runner.model).__name__,
            find_unused_parameters=getattr(runner.model,
                                           'find_unused_parameters', None),
            num_workers=loader.num_workers,
            persistent_workers=loader.persistent_workers)
        model = _unwrapped(runner.model)
        for augment in model.data_preprocessor.batch_augments or ():
            if hasattr(augment, 'copy_blend'):
                self._count_copy_blend(augment)
                self._count(augment, 'apply_mixup', 'mixup_calls')
        for assigner in matchers(model):
            self._count_matchings(assigner)

    def _current(self) -> dict:
        return self.record['epochs'][-1]

    def _count(self, obj, method: str, key: str) -> None:
        original = getattr(obj, method)

        def counted(*args, **kwargs):
            self._current()[key] += 1
            return original(*args, **kwargs)

        setattr(obj, method, counted)

    def _count_copy_blend(self, augment) -> None:
        original = augment.copy_blend

        def copy_blend(inputs, data_samples, beta):
            before = sum(len(s.gt_instances) for s in data_samples)
            inputs, data_samples = original(inputs, data_samples, beta)
            current = self._current()
            current['copy_blend_calls'] += 1
            current['copy_blend_pasted'] += sum(
                len(s.gt_instances) for s in data_samples) - before
            return inputs, data_samples

        augment.copy_blend = copy_blend

    def _count_matchings(self, assigner) -> None:
        original = assigner.assign

        def assign(pred_instances, gt_instances, *args, **kwargs):
            if len(gt_instances):
                cost = 'late' if assigner.changed else 'early'
                self._current()[f'matchings_with_gt_{cost}_cost'] += 1
            return original(pred_instances, gt_instances, *args, **kwargs)

        assigner.assign = assign

    def before_train_epoch(self, runner) -> None:
        model = _unwrapped(runner.model)
        assigners = matchers(model)
        epoch = dict(
            epoch=runner.epoch,
            matcher_changed=[a.changed for a in assigners],
            matcher_epochs=[a.epoch for a in assigners],
            copy_blend_calls=0,
            copy_blend_pasted=0,
            mixup_calls=0,
            matchings_with_gt_early_cost=0,
            matchings_with_gt_late_cost=0,
            resized_from_another_shape=0,
            worker_pids=[],
            losses=[])
        self.record['epochs'].append(epoch)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        current = self._current()
        if not current['losses']:
            current['worker_pids'] = worker_pids(runner.train_dataloader)
        current['losses'].append(float(outputs['loss']))
        current['resized_from_another_shape'] += sum(
            map(resized_from_another_shape, data_batch['data_samples']))

    def after_train(self, runner) -> None:
        path = osp.join(runner.work_dir,
                        f'recipe_record_rank{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(self.record, f)


class UpstreamEmptyDnLosses:
    """Head mixin (for ``swap_behaviour``): upstream DEIMv2's criterion,
    which computes dn loss terms only when the outputs have ``dn_outputs``
    (its denoising returns None on a batch without GT): the loss dict of
    a batch without dn queries has no dn terms."""

    def loss(self, *args, dn_meta, **kwargs):
        losses = super().loss(*args, dn_meta=dn_meta, **kwargs)
        if dn_meta['num_denoising_queries'] == 0:
            losses = {k: v for k, v in losses.items() if '_dn_' not in k}
        return losses


@MODELS.register_module()
class DEIMv2UpstreamEmptyDnHead(UpstreamEmptyDnLosses, DEIMv2Head):
    """:class:`DEIMv2Head` with upstream's criterion on a batch without dn
    queries (:class:`UpstreamEmptyDnLosses`). Same config keys."""


@MODELS.register_module()
class DEIMv2UpstreamEmptyDn(DEIMv2):
    """:class:`DEIMv2` whose dn generator returns no queries on a batch
    without GT, as upstream's denoising (None there); with
    ``bbox_head.type='DEIMv2UpstreamEmptyDnHead'`` the whole upstream
    behaviour. Same config keys."""

    def _ddp_safe_generator(self, dn_cfg: dict):
        generator = super()._ddp_safe_generator(dn_cfg)
        generator.__class__ = type('UpstreamEmptyDnGenerator',
                                   (_UpstreamEmptyDn, type(generator)), {})
        return generator


__all__ = [
    'DEIMv2RecipeRecordHook', 'UpstreamEmptyDnLosses',
    'DEIMv2UpstreamEmptyDnHead', 'DEIMv2UpstreamEmptyDn'
]
