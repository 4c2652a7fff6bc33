"""A checkpoint resumed on another number of ranks or with another batch
size (a job requeued onto fewer GPUs, a batch size lowered after running
out of memory): the pass goes on after the samples the checkpoint trained,
so none of the pass is left out and fewer than one global batch of it is
trained again. Exactness needs the same world size and batch size
(test_exact_resume.py)."""
import collections
import glob
import os
import os.path as osp

import pytest

from mmddp_ext.runner.exact_resume import same_samples_position
from mmddp_ext.testing import run_on_ranks
from .test_exact_resume import _cfg, _stopped, _train
from .toy import read_trained

SAMPLES = 12  # the toy dataset; 6 batches of 2 per epoch on one rank
STOP = 8  # the checkpoint: after 9 iterations, 3 batches into epoch 1


def _stopped_in_epoch_1(work_dir):
    """One rank, 2 images per batch, stopped 6 samples into epoch 1; what
    it trained of epoch 1."""
    _stopped(work_dir, STOP)
    return read_trained(work_dir, 0)[6:STOP + 1]


def _counts(records):
    return collections.Counter(i for r in records for i in r['indices'])


def test_another_batch_size_leaves_no_sample_out(tmp_path, monkeypatch):
    """Resumed with 4 images per batch: the 6 samples trained are one
    batch of 4 here, so 2 of them are trained again, and the pass's other
    6 all follow. The control (the position kept in batches, as before):
    3 batches of 4 skip the whole pass, and 6 samples are never trained
    in epoch 1."""
    from mmddp_ext.runner import exact_resume
    for switched_off in (False, True):
        work_dir = tmp_path / f'off{int(switched_off)}'
        before = _stopped_in_epoch_1(work_dir)
        if switched_off:
            monkeypatch.setattr(exact_resume, 'same_samples_position',
                                lambda position, *args: (position, None))
        cfg = _cfg(work_dir)
        cfg.train_dataloader.batch_size = 4
        cfg.resume = 'auto'
        runner = _train(cfg)
        after = read_trained(work_dir, 0)[STOP + 1:]
        epoch_1, epoch_2 = after[:-3], after[-3:]  # epoch 2: 3 batches of 4
        assert all(len(r['indices']) == 4 for r in after)
        assert _counts(epoch_2) == {i: 1 for i in range(SAMPLES)}
        counts = _counts(before + epoch_1)
        if switched_off:
            assert epoch_1 == []
            assert SAMPLES - len(counts) == 6  # left out of epoch 1
        else:
            assert set(counts) == set(range(SAMPLES))
            assert sorted(counts.values()) == [1] * 10 + [2] * 2
        assert runner.epoch == 3


def _resume_here(work_dir):
    from mmddp_ext.runner import ExtRunner
    cfg = _cfg(work_dir)
    cfg.resume = 'auto'
    cfg.launcher = 'pytorch'
    runner = ExtRunner.from_cfg(cfg)
    runner.train()
    return runner.epoch


def test_another_world_size_leaves_no_sample_out(tmp_path):
    """A one-rank checkpoint resumed on 2 ranks: the 6 samples trained are
    one batch of 2 on each rank, so 2 of them are trained again; the rest
    of the pass is dealt to both ranks, and each rank says what changed."""
    work_dir = tmp_path / 'run'
    before = _stopped_in_epoch_1(work_dir)
    log_dir = str(tmp_path / 'ranks')
    os.makedirs(log_dir)
    assert run_on_ranks(
        _resume_here,
        2,
        args=(str(work_dir), ),
        timeout=90,
        init_group=False,
        log_dir=log_dir) == [3, 3]
    resumed = [read_trained(work_dir, 0)[STOP + 1:], read_trained(work_dir, 1)]
    epoch_1 = [r for rank in resumed for r in rank[:-3]]
    epoch_2 = [r for rank in resumed for r in rank[-3:]]
    assert _counts(epoch_2) == {i: 1 for i in range(SAMPLES)}
    counts = _counts(before + epoch_1)
    assert set(counts) == set(range(SAMPLES))
    assert sorted(counts.values()) == [1] * 10 + [2] * 2
    for path in sorted(glob.glob(osp.join(log_dir, 'rank*.log'))):
        with open(path) as f:
            assert 'resumed on another number of ranks' in f.read(), path


@pytest.mark.parametrize(
    'recorded, here, expected',
    [
        ((1, 2), (1, 2), (3, None)),  # the same run: exact resume
        ((8, 2), (4, 2), (6, 0)),  # half the ranks: twice the batches
        ((2, 2), (4, 2), (1, 4)),  # twice the ranks: 12 samples, 1 batch of 8
        ((4, 4), (2, 2), (12, 0)),
    ])
def test_same_samples_position(recorded, here, expected):
    position, text = same_samples_position(
        3, dict(world_size=recorded[0], batch_size=recorded[1]), *here)
    assert position == expected[0]
    if expected[1] is None:
        assert text is None
    else:
        assert f'so {expected[1]} of them are trained again' in text


def test_a_checkpoint_without_the_sizes_keeps_its_position():
    """Checkpoints of the previous release record no sizes."""
    assert same_samples_position(5, {}, 2, 2) == (5, None)
