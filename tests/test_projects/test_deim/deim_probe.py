"""Test-only components for the DEIM DDP runs, loaded through a run's
``custom_imports`` (next to ``test_dfine/ddp_probe.py``'s
``GradientRecordHook``):

- ``ResumeRecordHook`` writes, per rank, the EMA's update count and a
  checksum of its weights when training starts (after a resume has loaded
  them), and the epoch each train epoch's data policy and batch augments
  were given;
- ``DEIMUpstreamEmptyDnHead`` with ``test_dfine/ddp_probe.py``'s
  ``DFINEUpstreamEmptyDn`` (DEIM's model is D-FINE's) give the model
  upstream DEIM's behaviour on a batch without GT (the negative control
  of ``test_deim_dist.py``): its denoising returns None, so there are no
  dn queries and no dn loss terms on that rank (its loss dict is
  shorter).
"""
import importlib
import json
import os.path as osp

from mmdet.registry import MODELS
from mmengine.dist import get_rank
from mmengine.hooks import EMAHook, Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

_deim = importlib.import_module('projects.DEIM.deim')
# registers DFINEUpstreamEmptyDn, the control's model
importlib.import_module('tests.test_projects.test_dfine.ddp_probe')


def _policy_datasets(dataset):
    while dataset is not None:
        if hasattr(dataset, 'set_epoch'):
            yield dataset
        dataset = getattr(dataset, 'dataset', None)


@HOOKS.register_module()
class ResumeRecordHook(Hook):
    """See the module docstring; writes ``resume_record_rank{rank}.json``
    in the work dir after training."""
    priority = 'LOWEST'

    def __init__(self):
        self.record = dict(epochs=[])

    def before_train(self, runner) -> None:
        ema = next(h for h in runner.hooks if isinstance(h, EMAHook))
        state = ema.ema_model.module.state_dict()
        self.record.update(
            start_iter=runner.iter,
            ema_steps=int(ema.ema_model.steps),
            ema_sum={
                k: float(v.double().sum())
                for k, v in state.items() if v.dtype.is_floating_point
            })

    def before_train_epoch(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        augments = model.data_preprocessor.batch_augments or []
        datasets = list(_policy_datasets(runner.train_dataloader.dataset))
        self.record['epochs'].append(
            dict(
                epoch=runner.epoch,
                dataset_epochs=[d.epoch for d in datasets],
                stages=[d.stage(d.epoch) for d in datasets],
                augment_epochs=[
                    a.epoch for a in augments if hasattr(a, 'set_epoch')
                ]))

    def after_train(self, runner) -> None:
        path = osp.join(runner.work_dir,
                        f'resume_record_rank{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(self.record, f)


@MODELS.register_module()
class DEIMUpstreamEmptyDnHead(_deim.DEIMHead):
    """:class:`DEIMHead` without dn loss terms when the batch had no dn
    queries (upstream DEIM: no ``dn_outputs``). Same config keys."""

    def loss(self, *args, dn_meta, **kwargs):
        losses = super().loss(*args, dn_meta=dn_meta, **kwargs)
        if dn_meta['num_denoising_queries'] == 0:
            losses = {k: v for k, v in losses.items() if '_dn_' not in k}
        return losses


__all__ = ['DEIMUpstreamEmptyDnHead', 'ResumeRecordHook']
