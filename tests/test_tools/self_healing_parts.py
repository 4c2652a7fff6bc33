"""Toy models, datasets and hooks for the self-healing runs of
``tools/dist_train.sh`` (``self_healing_toy.py`` and
``self_healing_finetune.py`` import this module).

``MMDDP_TEST_SWITCH_OFF`` (a comma-separated list, read at import on every
rank) switches mechanisms off for the negative controls:

- ``start_rule``: ExtRunner starts as before issue 28: after a torchrun
  restart, MMEngine's auto-resume with ``load_from`` cleared (what
  tools/train.py did), nothing read from the work dir, and AutoDDP applies
  a stored decision only in its first ``train_step``.
- ``early_apply``: AutoDDP applies a stored decision only in its first
  ``train_step`` (after every hook's ``before_train``).
"""
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.models.backbones import ResNet
from mmengine.dataset import BaseDataset
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS

SWITCH_OFF_ENV = 'MMDDP_TEST_SWITCH_OFF'


def _attempt() -> int:
    return int(os.environ.get('TORCHELASTIC_RESTART_COUNT', '0'))


@MODELS.register_module()
class SelfHealingToyModel(BaseModel):
    """A linear model with a branch ``late`` that rank 1 stops using after
    ``used_calls`` forward calls of its process (0: always used), as a
    data-dependent branch or layer drop would: a probe in a fresh process
    sees it used."""

    def __init__(self, used_calls: int = 0):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.late = nn.Linear(4, 1)
        self.used_calls = used_calls
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss', **kwargs):
        self.calls += 1
        loss = self.linear(inputs).pow(2).mean()
        skip_late = (
            self.used_calls and self.calls > self.used_calls
            and dist.get_rank() == 1)
        if not skip_late:
            loss = loss + self.late(inputs).abs().mean()
        return dict(loss=loss)


@DATASETS.register_module()
class SelfHealingToyDataset(BaseDataset):
    """``size`` random 4-vectors."""

    def __init__(self, size: int = 64, **kwargs):
        self.size = size
        super().__init__(serialize_data=False, **kwargs)

    def load_data_list(self):
        generator = torch.Generator().manual_seed(0)
        return [
            dict(inputs=torch.randn(4, generator=generator))
            for _ in range(self.size)
        ]


@MODELS.register_module()
class SelfHealingResNet(BaseModel):
    """A tiny mmdet ResNet-18 (``with_cp`` as given) and a branch ``late``
    on its pooled features that rank 1 stops using after ``used_calls``
    forward calls of its process (0: always used)."""

    def __init__(self, with_cp: bool = False, used_calls: int = 0):
        super().__init__()
        self.backbone = ResNet(
            depth=18,
            num_stages=2,
            strides=(1, 2),
            dilations=(1, 1),
            out_indices=(0, 1),
            base_channels=8,
            stem_channels=8,
            with_cp=with_cp)
        self.late = nn.Linear(16, 1)
        self.used_calls = used_calls
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss', **kwargs):
        self.calls += 1
        feats = self.backbone(inputs)
        loss = sum(feat.pow(2).mean() for feat in feats)
        skip_late = (
            self.used_calls and self.calls > self.used_calls
            and dist.get_rank() == 1)
        if not skip_late:
            loss = loss + self.late(feats[-1].mean((2, 3))).abs().mean()
        return dict(loss=loss)


@DATASETS.register_module()
class SelfHealingImages(SelfHealingToyDataset):
    """``size`` random 3x32x32 images."""

    def load_data_list(self):
        generator = torch.Generator().manual_seed(0)
        return [
            dict(inputs=torch.randn(3, 32, 32, generator=generator))
            for _ in range(self.size)
        ]


@HOOKS.register_module()
class SIGKILLRankOnce(Hook):
    """SIGKILL rank ``rank`` at the start of iteration ``at_iter`` (as the
    log counts; 0: never), in torchrun's attempt ``attempt`` only (0: the
    first)."""

    def __init__(self, rank: int = 1, at_iter: int = 0, attempt: int = 0):
        self.rank = rank
        self.at_iter = at_iter
        self.attempt = attempt

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if (_attempt() == self.attempt and runner.rank == self.rank
                and runner.iter + 1 == self.at_iter):
            os.kill(os.getpid(), signal.SIGKILL)


def _switch_off(names) -> None:
    from mmengine.runner import Runner

    from mmddp_ext import ExtRunner
    from mmddp_ext.runner.start_point import restart_count
    from mmddp_ext.wrappers import AutoDDP
    if 'start_rule' in names or 'early_apply' in names:
        apply, train_step = (AutoDDP.apply_resumed_decision,
                             AutoDDP.train_step)

        def apply_in_first_step(self, data, optim_wrapper):
            apply(self)
            return train_step(self, data, optim_wrapper)

        AutoDDP.apply_resumed_decision = lambda self: False
        AutoDDP.train_step = apply_in_first_step
    if 'start_rule' in names:

        def load_or_resume(self):
            if restart_count() and not self._has_loaded:
                self._resume, self._load_from = True, None
            Runner.load_or_resume(self)

        ExtRunner.load_or_resume = load_or_resume


_switch_off([n for n in os.environ.get(SWITCH_OFF_ENV, '').split(',') if n])
