"""An iteration-based ExtRunner run without dataloader workers goes to its
next epoch without MMEngine's 2 s pause; the sampler's epoch still
advances. Stock ``Runner`` (the control) pauses at every epoch end."""
import mmengine.runner.loops as loops
import pytest
import torch
import torch.nn as nn
from mmengine.dataset import DefaultSampler
from mmengine.model import BaseModel

import mmddp_ext.runner.resumable_iter_loop as resumable_iter_loop


class _Linear(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='loss'):
        inputs = torch.stack(inputs) if isinstance(inputs, list) else inputs
        return dict(loss=self.linear(inputs).pow(2).mean())


class _Data(torch.utils.data.Dataset):

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return dict(inputs=torch.ones(2) * index)


class _Clock:
    """Stands in for the ``time`` module of MMEngine's loops."""

    def __init__(self):
        self.sleeps = []

    def sleep(self, seconds):
        self.sleeps.append(seconds)

    def __getattr__(self, name):
        import time
        return getattr(time, name)


@pytest.mark.parametrize('runner_type, workers, pauses', [
    ('ExtRunner', 0, 0),
    ('Runner', 0, 2),  # the control: a pause per epoch end
    ('ExtRunner', 1, 2),  # workers keep MMEngine's guard
])
def test_epoch_ends_pause_only_with_workers(tmp_path, monkeypatch,
                                            runner_type, workers, pauses):
    from mmengine.runner import Runner

    from mmddp_ext.runner import ExtRunner
    clock = _Clock()
    monkeypatch.setattr(loops, 'time', clock)
    monkeypatch.setattr(resumable_iter_loop, 'time', clock)
    runner = dict(ExtRunner=ExtRunner, Runner=Runner)[runner_type](
        model=_Linear(),
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=_Data(),
            sampler=dict(type='DefaultSampler', shuffle=True),
            batch_size=1,
            num_workers=workers,
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=6),
        default_hooks=dict(logger=None, checkpoint=None),
        cfg=dict())
    runner.train()
    assert runner.iter == 6
    assert clock.sleeps == [2] * pauses
    loader = runner.train_loop.dataloader
    # with a batch sampler (ExtRunner's ResumableBatchSampler, mmdet's
    # AspectRatioBatchSampler) the DataLoader's own .sampler is torch's
    # SequentialSampler and MMEngine sets the epoch on the batch sampler's
    sampler = getattr(loader.batch_sampler, 'sampler', loader.sampler)
    assert isinstance(sampler, DefaultSampler) and sampler.epoch == 2
