"""A toy model, dataset and hooks for the self-healing runs of
``tools/dist_train.sh`` (``self_healing_toy.py`` imports this module)."""
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.dataset import BaseDataset
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import DATASETS, HOOKS, MODELS


def _first_attempt() -> bool:
    return os.environ.get('TORCHELASTIC_RESTART_COUNT', '0') == '0'


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


@HOOKS.register_module()
class SIGKILLRankOnce(Hook):
    """SIGKILL rank ``rank`` at the start of iteration ``at_iter`` (as the
    log counts; 0: never), in torchrun's first attempt only."""

    def __init__(self, rank: int = 1, at_iter: int = 0):
        self.rank = rank
        self.at_iter = at_iter

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if (_first_attempt() and runner.rank == self.rank
                and runner.iter + 1 == self.at_iter):
            os.kill(os.getpid(), signal.SIGKILL)
