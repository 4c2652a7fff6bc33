"""Test-only components for the D-FINE DDP runs, loaded through a run's
``custom_imports``:

- ``GradientRecordHook`` writes, per rank, which trainable parameters got
  a gradient and which loss keys (and values) each iteration produced;
- ``DFINEUpstreamEmptyDn`` is :class:`DFINE` with upstream D-FINE's
  behaviour on a batch without GT (the negative control): no denoising
  query at all (``dn_num_group: 0``), the dn loss terms computed on empty
  outputs as upstream's criterion does, and the dn class embedding left
  out of that rank's graph.
"""
import importlib
import json
import math
import os.path as osp

from mmdet.registry import MODELS
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from mmddp_ext.models.layers import DUMMY_DN_GROUP_KEY

_dfine = importlib.import_module('projects.D-FINE.dfine')


@HOOKS.register_module()
class GradientRecordHook(Hook):
    """Record, per iteration, the trainable parameters that received a
    gradient and the loss keys and values, and write them at the end of
    training to ``{work_dir}/grad_record_rank{rank}.json``.

    Args:
        out_dir (str, optional): Where to write. Defaults to the work dir.
    """

    def __init__(self, out_dir=None):
        self.out_dir = out_dir
        self.received = set()
        self.records = []

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self.trainable = sorted(name for name, p in model.named_parameters()
                                if p.requires_grad)
        for name, param in model.named_parameters():
            if param.requires_grad:
                param.register_post_accumulate_grad_hook(
                    lambda _, name=name: self.received.add(name))

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        values = {k: float(v) for k, v in (outputs or {}).items()}
        self.records.append(
            dict(
                iter=runner.iter,
                num_gt=sum(
                    len(s.gt_instances) for s in data_batch['data_samples']),
                missing_grads=sorted(set(self.trainable) - self.received),
                loss_keys=sorted(k for k in values if k.startswith('loss_')),
                all_finite=all(map(math.isfinite, values.values()))))
        self.received = set()

    def after_train(self, runner) -> None:
        path = osp.join(self.out_dir or runner.work_dir,
                        f'grad_record_rank{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(
                dict(trainable=len(self.trainable), records=self.records), f)


class _UpstreamEmptyDn:
    """Generator mixin: upstream D-FINE's dn part of a batch without GT
    (no queries, no mask, zero groups)."""

    def __call__(self, batch_data_samples):
        if any(len(s.gt_instances) for s in batch_data_samples):
            return super().__call__(batch_data_samples)
        weight = self.label_embedding.weight
        batch_size = len(batch_data_samples)
        dn_meta = {
            'num_denoising_queries': 0,
            'num_denoising_groups': 0,
            DUMMY_DN_GROUP_KEY: False,
        }
        return (weight.new_zeros(batch_size, 0, self.embed_dims),
                weight.new_zeros(batch_size, 0, 4), None, dn_meta)


@MODELS.register_module()
class DFINEUpstreamEmptyDn(_dfine.DFINE):
    """:class:`DFINE` whose dn generator behaves as upstream's on a batch
    without GT (see the module docstring). Same config keys."""

    def _ddp_safe_generator(self, dn_cfg: dict):
        generator = super()._ddp_safe_generator(dn_cfg)
        generator.__class__ = type('UpstreamEmptyDnGenerator',
                                   (_UpstreamEmptyDn, type(generator)), {})
        return generator
