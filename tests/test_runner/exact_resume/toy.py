"""A toy model and dataset for the exact-resume tests: every source of
randomness a detector's training has, in a few hundred parameters.

- the dataset draws its augmentation from Python's, numpy's and torch's
  global generators (as mmcv / mmdet transforms do), in the worker or the
  main process that loads it;
- the collate function draws a batch-level scale (as multi-scale collates
  do);
- the model draws noise and a dropout mask in its step (as denoising
  queries do);
- the optimizer has momentum, the schedule changes the learning rate every
  iteration, and an EMA hook averages the weights.

Each rank appends what it trained to ``<work_dir>/trained_rank<R>.jsonl``:
one line per iteration with the sample indices, their augmentation draws
and the learning rate, so the tests compare data order, augmentation and
schedule, not only the final weights.
"""
import json
import os
import os.path as osp
import random
import signal
import time

import numpy as np
import torch
import torch.nn as nn
from mmengine.dataset import pseudo_collate
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, FUNCTIONS, HOOKS, MODELS


@DATASETS.register_module()
class ExactResumeToyDataset(torch.utils.data.Dataset):
    """``size`` samples; sample ``i`` is a fixed vector plus augmentation."""

    metainfo = dict(classes=('toy', ))

    def __init__(self, size: int = 12, dim: int = 4, pipeline=None) -> None:
        self.size = size
        self.dim = dim
        self.loads = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        self.loads += 1
        base = (torch.arange(self.dim, dtype=torch.float32) + index) / (
            self.size + self.dim)
        draws = [
            random.random(),
            float(np.random.rand()),
            float(torch.rand(()))
        ]
        return dict(
            inputs=base * (1 + draws[0]) + draws[1] - draws[2],
            data_samples=dict(index=int(index), draws=draws))


@FUNCTIONS.register_module()
def exact_resume_toy_collate(samples):
    batch = pseudo_collate(samples)
    batch['scale'] = random.uniform(0.5, 1.5)
    return batch


@MODELS.register_module()
class ExactResumeToyModel(BaseModel):
    """Two linear layers with dropout and noise; logs what it trains
    (to ``log_dir``) and sleeps ``step_delay`` seconds per step."""

    def __init__(self,
                 dim: int = 4,
                 log_dir: str = '',
                 step_delay: float = 0.0) -> None:
        super().__init__()
        self.step_delay = step_delay
        self.net = nn.Sequential(
            nn.Linear(dim, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 1))
        self.log_dir = log_dir

    def forward(self, inputs, data_samples=None, mode='loss', scale=1.0):
        x = torch.stack(inputs) * scale
        x = x + 0.1 * torch.randn_like(x)
        out = self.net(x).squeeze(-1)
        if mode != 'loss':
            return [dict(pred=o) for o in out]
        if self.log_dir:
            self._record(data_samples, scale)
        if self.step_delay:  # time for a test to signal mid-run
            time.sleep(self.step_delay)
        return dict(loss=(out - 1).pow(2).mean())

    def _record(self, data_samples, scale) -> None:
        record = dict(
            pid=os.getpid(),
            # pseudo_collate gives a dict of per-sample lists
            indices=list(data_samples['index']),
            draws=data_samples['draws'],
            scale=scale)
        path = osp.join(self.log_dir, f'trained_rank{get_rank()}.jsonl')
        os.makedirs(self.log_dir, exist_ok=True)
        with open(path, 'a') as f:
            f.write(json.dumps(record) + '\n')


def read_trained(log_dir: str, rank: int, with_pid: bool = False):
    """What ``rank`` trained, one dict per iteration (without the process
    id unless asked: a resumed run is another process), with the learning
    rate and momentum of the iteration where RecordScheduleHook ran."""
    with open(osp.join(log_dir, f'trained_rank{rank}.jsonl')) as f:
        records = [json.loads(line) for line in f]
    if not with_pid:
        for record in records:
            record.pop('pid')
    schedule = osp.join(log_dir, f'schedule_rank{rank}.jsonl')
    if osp.exists(schedule):
        with open(schedule) as f:
            for record, line in zip(records, f):
                record['lr'], record['momentum'] = json.loads(line)
    return records


@HOOKS.register_module()
class SignalAtIterationHook(Hook):
    """Sends ``signum`` to this process before iteration ``iteration``, as
    a cluster would, in the middle of a run."""

    def __init__(self, iteration: int, signum: int = signal.SIGUSR1):
        self.iteration = iteration
        self.signum = signum

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iteration:
            os.kill(os.getpid(), self.signum)


@HOOKS.register_module()
class CrashAtIterationHook(Hook):
    """Raises before iteration ``iteration``: a process that dies without
    warning (no signal, no checkpoint of its own)."""

    def __init__(self, iteration: int):
        self.iteration = iteration

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iteration:
            raise RuntimeError(f'crash before iteration {self.iteration}')


@HOOKS.register_module()
class SignalDuringSaveHook(Hook):
    """Sends ``signum`` to this process while the first checkpoint is being
    written (from ``before_save_checkpoint``, inside the save)."""

    def __init__(self, signum: int = signal.SIGTERM):
        self.signum = signum
        self.sent = False

    def before_save_checkpoint(self, runner, checkpoint):
        if not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


@HOOKS.register_module()
class RecordScheduleHook(Hook):
    """Appends each iteration's learning rate and momentum, as the
    optimizer used them, to ``<log_dir>/schedule_rank<R>.jsonl``."""

    priority = 'HIGHEST'  # before ParamSchedulerHook steps them

    def __init__(self, log_dir: str = '') -> None:
        self.log_dir = log_dir

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        if not self.log_dir:
            return
        group = runner.optim_wrapper.optimizer.param_groups[0]
        path = osp.join(self.log_dir, f'schedule_rank{get_rank()}.jsonl')
        with open(path, 'a') as f:
            f.write(json.dumps([group['lr'], group['momentum']]) + '\n')
