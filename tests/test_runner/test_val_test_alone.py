"""``runner.val()`` and ``runner.test()`` on their own (evaluating a
checkpoint) build no training loop, dataloader or dataset with ExtRunner,
as with MMEngine's ``Runner`` (the control); ``tools/test.py`` too."""
import importlib.util
import os.path as osp
import time

import pytest
import torch
from mmengine.evaluator import BaseMetric
from mmengine.registry import DATASETS, METRICS, MODELS
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmddp_ext.hooks import RankStatusHook
from mmddp_ext.runner import ExtRunner
from ..helpers import REPO_ROOT, ToyModel

BUILT = []  # the split of every dataset built
MODELS.register_module(name='ValAloneToyModel', force=True)(ToyModel)


class TrainingDataAbsent(FileNotFoundError):
    pass


@DATASETS.register_module(name='ValAloneToyDataset', force=True)
class _ToyDataset(Dataset):
    """Four points; the train split counts its builds and fails to build,
    as when the training data is not on the evaluating machine."""

    def __init__(self, split: str):
        BUILT.append(split)
        if split == 'train':
            raise TrainingDataAbsent('the training data is not here')

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return dict(inputs=torch.full((2, ), float(index)))


@METRICS.register_module(name='ValAloneCount', force=True)
class _Count(BaseMetric):

    def process(self, data_batch, data_samples):
        self.results.append(len(data_samples))

    def compute_metrics(self, results):
        return dict(samples=sum(results))


def _loader(split):
    return dict(
        dataset=dict(type='ValAloneToyDataset', split=split),
        sampler=dict(type='DefaultSampler', shuffle=False),
        batch_size=2,
        collate_fn=dict(type='default_collate'))


def _config(work_dir, checkpoint):
    return dict(
        work_dir=str(work_dir),
        experiment_name=f'val_alone_{time.time_ns()}',
        default_scope='mmengine',
        load_from=str(checkpoint),
        train_dataloader=_loader('train'),
        train_cfg=dict(by_epoch=False, max_iters=2),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        val_dataloader=_loader('val'),
        val_cfg=dict(type='ValLoop'),
        val_evaluator=dict(type='ValAloneCount'),
        test_dataloader=_loader('test'),
        test_cfg=dict(type='TestLoop'),
        test_evaluator=dict(type='ValAloneCount'))


@pytest.fixture
def checkpoint(tmp_path):
    path = tmp_path / 'trained.pth'
    torch.save(dict(meta={}, state_dict=ToyModel().state_dict()), path)
    return path


@pytest.mark.parametrize('runner_type', [Runner, ExtRunner])
@pytest.mark.parametrize('mode', ['val', 'test'])
def test_evaluating_a_checkpoint_builds_no_training_data(
        tmp_path, checkpoint, runner_type, mode):
    """The control is MMEngine's Runner: ExtRunner must behave as it."""
    BUILT.clear()
    runner = runner_type(
        model=ToyModel(), **_config(tmp_path / 'work', checkpoint))
    assert getattr(runner, mode)() == dict(samples=4)
    assert BUILT == [mode]
    assert isinstance(runner._train_loop, dict)  # never built


class IterReadingRankStatusHook(RankStatusHook):
    """RankStatusHook as it was: ``before_val`` reads ``runner.iter``."""

    def before_val(self, runner) -> None:
        self._report(runner.iter, 'validation')


def test_reading_runner_iter_in_val_needs_the_training_data(
        tmp_path, checkpoint):
    """Negative control: ExtRunner with the hook that read ``runner.iter``
    (listed in the config, so ExtRunner adds no RankStatusHook of its own)
    builds the training loop in ``val()`` and fails without the data."""
    BUILT.clear()
    runner = ExtRunner(
        model=ToyModel(),
        custom_hooks=[IterReadingRankStatusHook()],
        **_config(tmp_path / 'work', checkpoint))
    with pytest.raises(TrainingDataAbsent):
        runner.val()
    assert BUILT == ['val', 'train']


def _tools_test():
    spec = importlib.util.spec_from_file_location(
        'mmddp_ext_test_cli', osp.join(REPO_ROOT, 'tools', 'test.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize('runner_type', ['Runner', 'ExtRunner'])
def test_tools_test_py_needs_no_training_data(tmp_path, checkpoint,
                                              runner_type):
    """``tools/test.py CONFIG CHECKPOINT`` (ExtRunner, its default) builds
    the test dataset only, as with ``runner_type='Runner'``."""
    config = tmp_path / 'toy.py'
    cfg = _config(tmp_path / 'unused', checkpoint)
    cfg['model'] = dict(type='ValAloneToyModel')
    cfg['runner_type'] = runner_type
    config.write_text(''.join(f'{key} = {value!r}\n'
                              for key, value in cfg.items()))
    BUILT.clear()
    _tools_test().main([
        str(config),
        str(checkpoint), '--work-dir',
        str(tmp_path / 'work')
    ])
    assert BUILT == ['test']
