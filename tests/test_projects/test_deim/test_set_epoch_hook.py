"""``SetEpochHook`` + ``EpochPolicyDataset`` in a real Runner: the data
workers run each epoch's policy (persistent workers restarted when it
changes), and a resumed run runs the policy of the epoch it resumes at.

The train pipeline is made of stand-ins that record their names, so the
model sees which ops each sample went through in the data worker.
"""
import pytest
import torch
import torch.nn as nn
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmengine.model import BaseModel

from mmddp_ext.runner import ExtRunner
from .deim_utils import import_deim
from .test_epoch_policy_dataset import Items, _stand_ins

# ops of each stage of policy [1, 2, 3] (no draws needed in 0, 2 and 3)
STAGE_OPS = {
    0: {('RandomFlip', )},
    1: {('DEIMMosaic', 'PhotoMetricDistortion', 'RandomFlip'),
        ('PhotoMetricDistortion', 'Expand', 'RandomIoUCrop', 'RandomFlip')},
    2: {('PhotoMetricDistortion', 'Expand', 'RandomIoUCrop', 'RandomFlip')},
}
SEEN = []


class PackRan(BaseTransform):
    """Packs the recorded op names for the toy model."""

    def transform(self, results):
        return dict(
            inputs=torch.ones(2),
            data_samples=','.join(results.get('ran', [])))


class RecordingModel(BaseModel):
    """Appends ``(epoch of the call, ops of each sample)`` to ``SEEN``."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.epoch = None

    def forward(self, inputs, data_samples=None, mode='tensor'):
        SEEN.append((self.epoch,
                     [tuple(s.split(',')) if s else () for s in data_samples]))
        return dict(loss=self.linear(torch.stack(inputs)).pow(2).mean())


def _pipeline():
    stand_ins = _stand_ins()
    if TRANSFORMS.get('PolicyPackRan') is None:
        TRANSFORMS.register_module(name='PolicyPackRan', module=PackRan)
    ops = [
        'DEIMMosaic', 'PhotoMetricDistortion', 'Expand', 'RandomIoUCrop',
        'RandomFlip'
    ]
    return stand_ins, [dict(type=stand_ins[op])
                       for op in ops] + [dict(type='PolicyPackRan')]


def train(work_dir, epochs, hooks, resume=None, persistent=True):
    from mmengine.hooks import Hook

    class MarkEpoch(Hook):

        def before_train_epoch(self, runner):
            runner.model.epoch = runner.epoch

    import_deim()
    stand_ins, pipeline = _pipeline()
    runner = ExtRunner(
        model=RecordingModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=dict(
                type='EpochPolicyDataset',
                dataset=Items(serialize_data=False),
                pipeline=pipeline,
                policy=dict(
                    epoch=[1, 2, 3],
                    ops=[
                        stand_ins[op]
                        for op in ('DEIMMosaic', 'PhotoMetricDistortion',
                                   'Expand', 'RandomIoUCrop')
                    ]),
                mosaic_prob=0.5,
                mosaic_type=stand_ins['DEIMMosaic'],
                mosaic_excludes=(stand_ins['Expand'],
                                 stand_ins['RandomIoUCrop'])),
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=2,
            num_workers=1,
            persistent_workers=persistent),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        train_cfg=dict(by_epoch=True, max_epochs=epochs),
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=1)),
        custom_hooks=[MarkEpoch()] + hooks,
        load_from=resume,
        resume=resume is not None,
        default_scope='mmdet',
        experiment_name=f'policy_{work_dir.name}_{epochs}')
    del SEEN[:]
    runner.train()
    return {
        epoch: {
            ops
            for _, batch in [(e, b) for e, b in SEEN if e == epoch]
            for ops in batch
        }
        for epoch in {e
                      for e, _ in SEEN}
    }


@pytest.fixture(scope='module')
def fresh(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp('fresh')
    return train(work_dir, 3, [dict(type='SetEpochHook')]), work_dir


def test_workers_run_each_epochs_policy(fresh):
    """Persistent workers: epoch 0 without policy ops, epoch 1 with
    Mosaic or zoom-out + IoU crop per sample, epoch 2 all but Mosaic: the
    workers are restarted at each change."""
    fresh, _ = fresh
    assert fresh[0] == STAGE_OPS[0]
    assert fresh[1] <= STAGE_OPS[1] and fresh[1]
    assert fresh[2] == STAGE_OPS[2]


def test_resumed_run_keeps_the_policy_epoch(fresh, tmp_path_factory):
    """Resumed from the checkpoint of epoch 2 (index 1), the run trains
    epoch index 2 with its policy, in fresh workers."""
    _, first = fresh
    resumed = train(
        tmp_path_factory.mktemp('resumed'),
        3, [dict(type='SetEpochHook')],
        resume=str(first / 'epoch_2.pth'))
    assert set(resumed) == {2}
    assert resumed[2] == STAGE_OPS[2]


def test_without_the_hook_workers_never_leave_stage_0(tmp_path):
    """Negative control: nothing tells the dataset the epoch (MMEngine has
    no set_epoch on datasets), so every epoch runs stage 0: no Mosaic, no
    photometric distortion, zoom-out or IoU crop, ever."""
    seen = train(tmp_path, 2, [])
    assert seen == {0: STAGE_OPS[0], 1: STAGE_OPS[0]}


def test_without_the_restart_persistent_workers_keep_their_epoch(tmp_path):
    """Negative control: ``SetEpochHook`` without the worker restart. The
    epoch set in the main process does not reach persistent workers
    started earlier; they run stage 0 for the whole run."""
    from mmengine.registry import HOOKS
    deim = import_deim()
    name = 'SetEpochNoRestartForTest'
    if HOOKS.get(name) is None:

        class NoRestart(deim.SetEpochHook):

            def before_train_epoch(self, runner):
                persistent = runner.train_dataloader.persistent_workers
                runner.train_dataloader.__dict__['persistent_workers'] = False
                try:
                    super().before_train_epoch(runner)
                finally:
                    runner.train_dataloader.__dict__[
                        'persistent_workers'] = persistent

        HOOKS.register_module(name=name, module=NoRestart)
    seen = train(tmp_path, 2, [dict(type=name)])
    assert seen == {0: STAGE_OPS[0], 1: STAGE_OPS[0]}
