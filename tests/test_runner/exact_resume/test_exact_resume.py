"""A run stopped by a signal at any iteration and resumed ends exactly where
the uninterrupted run ends (one process; the multi-rank and launcher runs
are in test_preemption_dist.py).

Each case trains the toy run of ``toy_config.py`` (dropout and noise in
the step, augmentation from the three global generators in the dataset, a
random scale in the collate function, momentum, a per-iteration schedule,
EMA) uninterrupted, then again stopped by ``SIGUSR1`` after iteration
``stop`` and resumed by a new runner, and compares: the samples and their
augmentation at every iteration, the learning rate, the counters, and
every weight of the model and of the EMA bit for bit.

Negative controls: with ``mmddp_ext_cfg.exact_resume=False`` (MMEngine's
resume) the resumed run trains the start of the epoch again; with each
part of exact resume removed alone, the resumed run differs where that
part acts.
"""
import json
import os.path as osp
import signal

import pytest
import torch
from mmengine.config import Config

from .toy import CrashAtIterationHook  # noqa: F401 (registers it)
from .toy import SignalAtIterationHook  # noqa: F401 (registers it)
from .toy import SignalDuringSaveHook  # noqa: F401 (registers it)
from .toy import read_trained

CONFIG = osp.join(osp.dirname(__file__), 'toy_config.py')
ITERS_PER_EPOCH = 6  # 12 samples, batch 2, one process


def _cfg(work_dir,
         loop='epoch',
         workers=0,
         persistent=False,
         ext=None,
         extra_hooks=(),
         seed=2026):
    cfg = Config.fromfile(CONFIG)
    cfg.randomness = dict(seed=seed)
    cfg.work_dir = str(work_dir)
    cfg.model.log_dir = str(work_dir)
    cfg.custom_hooks[1].log_dir = str(work_dir)  # RecordScheduleHook
    cfg.train_dataloader.num_workers = workers
    cfg.train_dataloader.persistent_workers = persistent and workers > 0
    if loop == 'iter':
        cfg.train_cfg = dict(by_epoch=False, max_iters=3 * ITERS_PER_EPOCH)
        cfg.train_dataloader.sampler = dict(
            type='InfiniteSampler', shuffle=True)
        cfg.default_hooks.checkpoint = dict(
            type='CheckpointHook', interval=ITERS_PER_EPOCH, by_epoch=False)
    cfg.mmddp_ext_cfg = dict(ext or {})
    cfg.custom_hooks = list(cfg.custom_hooks) + list(extra_hooks)
    return cfg


def _train(cfg):
    from mmddp_ext.runner import ExtRunner
    runner = ExtRunner.from_cfg(cfg)
    runner.train()
    return runner


def _final_state(runner):
    ema = [h for h in runner.hooks if type(h).__name__ == 'EMAHook'][0]
    model = {
        k: v.detach().clone()
        for k, v in runner.model.state_dict().items()
    }
    averaged = {
        k: v.detach().clone()
        for k, v in ema.ema_model.state_dict().items()
    }
    lr = runner.optim_wrapper.get_lr()['lr'][0]
    return model, averaged, lr, runner.iter, runner.epoch


def _stopped(work_dir, stop, **kwargs):
    """Train until ``SIGUSR1`` before iteration ``stop`` (0-based) stops
    the run with its checkpoint."""
    with pytest.raises(SystemExit) as stopped:
        _train(
            _cfg(
                work_dir,
                extra_hooks=[
                    dict(type='SignalAtIterationHook', iteration=stop)
                ],
                **kwargs))
    assert stopped.value.code == 128 + signal.SIGUSR1
    with open(work_dir / 'last_checkpoint') as f:
        assert f.read().strip().endswith(f'iter_{stop + 1}.pth')


def _stopped_and_resumed(tmp_path, stop, **kwargs):
    work_dir = tmp_path / 'stopped'
    _stopped(work_dir, stop, **kwargs)
    cfg = _cfg(work_dir, **kwargs)
    cfg.resume = 'auto'
    return _train(cfg), work_dir


def _assert_same(uninterrupted, resumed):
    model, ema, lr, iters, epoch = _final_state(uninterrupted)
    model_r, ema_r, lr_r, iters_r, epoch_r = _final_state(resumed)
    assert (iters_r, epoch_r) == (iters, epoch)
    assert lr_r == lr
    for key in model:
        assert torch.equal(model[key], model_r[key]), key
    for key in ema:
        assert torch.equal(ema[key], ema_r[key]), f'EMA {key}'


@pytest.mark.parametrize(
    'loop, workers, persistent, stop, seed',
    [
        ('epoch', 0, False, 8, 2026),
        ('epoch', 2, False, 8, 2026),
        ('epoch', 2, True, 5, None),  # the epoch's last iteration; no seed
        ('iter', 0, False, 7, 2026),
        ('iter', 2, True, 9, None),
    ])
def test_stopped_and_resumed_run_equals_uninterrupted(tmp_path, loop, workers,
                                                      persistent, stop, seed):
    """Without a seed in the config each run draws one; the resumed run
    takes the checkpoint's (MMEngine), and the uninterrupted run to match
    is the one with that seed."""
    kwargs = dict(loop=loop, workers=workers, persistent=persistent, seed=seed)
    resumed, work_dir = _stopped_and_resumed(tmp_path, stop, **kwargs)
    kwargs['seed'] = resumed.seed
    whole = _train(_cfg(tmp_path / 'whole', **kwargs))
    expected = read_trained(tmp_path / 'whole', 0)
    trained = read_trained(work_dir, 0)
    assert len(trained) == len(expected) == 3 * ITERS_PER_EPOCH
    # the same samples in the same order, augmented the same way, with the
    # same learning rate and momentum at every iteration
    assert trained == expected
    assert all('lr' in r and 'momentum' in r for r in trained)
    _assert_same(whole, resumed)
    if workers == 0:
        # the trained batches were skipped by index: the resumed run's
        # dataset loaded only the samples of the iterations it trained
        assert resumed.train_dataloader.dataset.loads == 2 * (
            3 * ITERS_PER_EPOCH - (stop + 1))
    if loop == 'epoch':
        for epoch in range(3):
            indices = sum(
                (r['indices']
                 for r in trained[epoch * ITERS_PER_EPOCH:(epoch + 1) *
                                  ITERS_PER_EPOCH]), [])
            assert sorted(indices) == list(range(12))  # each sample once


def test_mmengine_resume_trains_the_epoch_start_again(tmp_path):
    """The control: MMEngine's resume (exact_resume off) trains the first
    batches of the epoch again and ends elsewhere."""
    ext = dict(exact_resume=False)
    whole = _train(_cfg(tmp_path / 'whole', ext=ext))
    resumed, work_dir = _stopped_and_resumed(tmp_path, 8, ext=ext)
    trained = read_trained(work_dir, 0)
    assert len(trained) > 3 * ITERS_PER_EPOCH  # the epoch's start twice
    model, _, _, _, _ = _final_state(whole)
    model_r, _, _, _, _ = _final_state(resumed)
    assert any(not torch.equal(model[k], model_r[k]) for k in model)


@pytest.mark.parametrize('part', ['step_seed', 'sample_seed'])
def test_each_part_of_exact_resume_is_needed(tmp_path, monkeypatch, part):
    """Controls, one part of exact resume removed at a time: without the
    per-iteration seeds the resumed step draws other noise; without the
    per-sample seeds the workers augment other numbers after the resume."""
    from mmddp_ext.datasets import seeded_samples
    from mmddp_ext.runner import exact_resume
    if part == 'step_seed':
        monkeypatch.setattr(exact_resume, 'reseed_step',
                            lambda runner, tag, number: None)
        for module in ('resumable_epoch_loop', 'resumable_iter_loop'):
            monkeypatch.setattr(f'mmddp_ext.runner.{module}.reseed_step',
                                lambda runner, tag, number: None)
        kwargs = dict(workers=0)
    else:
        monkeypatch.setattr(
            seeded_samples.SeededFetch, '__call__',
            lambda self, keys: [self.dataset[int(k)] for k in keys])
        kwargs = dict(workers=2)
    whole = _train(_cfg(tmp_path / 'whole', **kwargs))
    resumed, work_dir = _stopped_and_resumed(tmp_path, 8, **kwargs)
    expected = read_trained(tmp_path / 'whole', 0)
    trained = read_trained(work_dir, 0)
    assert [r['indices'] for r in trained] == [r['indices'] for r in expected]
    model, _, _, _, _ = _final_state(whole)
    model_r, _, _, _, _ = _final_state(resumed)
    assert any(not torch.equal(model[k], model_r[k]) for k in model)
    if part == 'sample_seed':
        assert [r['draws'] for r in trained] != [r['draws'] for r in expected]


@pytest.mark.parametrize('exact', [True, False])
def test_a_crash_resumes_exactly_from_a_mid_epoch_checkpoint(tmp_path, exact):
    """No signal: the run dies two iterations after a checkpoint that
    ``CheckpointHook(by_epoch=False, interval=4)`` wrote mid-epoch (2
    workers). ``--resume`` trains the two lost iterations again, as the
    uninterrupted run trained them, and ends where it ends, bit for bit.
    The control (``exact_resume=False``, MMEngine's resume) starts the
    epoch again and ends elsewhere."""

    def cfg(work_dir, hooks=()):
        cfg = _cfg(
            work_dir,
            workers=2,
            ext=None if exact else dict(exact_resume=False),
            extra_hooks=hooks)
        cfg.default_hooks.checkpoint = dict(
            type='CheckpointHook', interval=4, by_epoch=False)
        return cfg

    crashing = cfg(tmp_path / 'run',
                   [dict(type='CrashAtIterationHook', iteration=10)])
    with pytest.raises(RuntimeError, match='crash before iteration 10'):
        _train(crashing)
    resuming = cfg(tmp_path / 'run')
    resuming.resume = 'auto'
    resumed = _train(resuming)
    whole = _train(cfg(tmp_path / 'whole'))
    trained = read_trained(tmp_path / 'run', 0)
    expected = read_trained(tmp_path / 'whole', 0)
    if not exact:
        assert trained[10:] != expected[8:]
        model, _, _, _, _ = _final_state(whole)
        model_r, _, _, _, _ = _final_state(resumed)
        assert any(not torch.equal(model[k], model_r[k]) for k in model)
        return
    # iterations 9 and 10 trained before the crash and again after it
    assert trained[:10] == expected[:10]
    assert trained[10:] == expected[8:]
    _assert_same(whole, resumed)


def _damage(path, how):
    if how == 'cut short':
        data = path.read_bytes()
        path.write_bytes(data[:len(data) // 2])
    else:
        path.unlink()


@pytest.mark.parametrize('how', ['cut short', 'missing'])
def test_a_damaged_latest_checkpoint_gives_way_to_the_one_before(
        tmp_path, how):
    """``last_checkpoint`` names a checkpoint cut short (a node lost before
    the file's data reached the disk) or gone: the resume passes over it
    to the newest whole checkpoint (epoch 1's), says why, and ends where
    the uninterrupted run ends, bit for bit. The control: MMEngine's
    resume of the file ``last_checkpoint`` names fails."""
    work_dir = tmp_path / 'run'
    _stopped(work_dir, 8)  # iter_9.pth, after epoch_1.pth
    _damage(work_dir / 'iter_9.pth', how)
    cfg = _cfg(work_dir)
    cfg.resume = 'auto'
    resumed = _train(cfg)
    _assert_same(_train(_cfg(tmp_path / 'whole')), resumed)
    trained = read_trained(work_dir, 0)
    assert len(trained) == 9 + 2 * ITERS_PER_EPOCH  # epoch 1 again
    with open(work_dir / 'mmddp_ext_start.json') as f:
        start = json.load(f)['start']  # what every rank logged
    assert start['action'] == 'resume' and start['warn']
    assert start['path'].endswith('epoch_1.pth')
    assert f'iter_9.pth, the latest checkpoint, is {how}' in start['why']
    with pytest.raises((RuntimeError, OSError)):  # torch: Invalid argument
        resumed.resume(str(work_dir / 'iter_9.pth'))


def test_no_whole_checkpoint_left_is_refused_with_the_fix(tmp_path):
    """Nothing whole to resume from, or ``--resume PATH`` naming a
    damaged file: a ValueError that names the file and what to do (before,
    torch's unpickling error, or a fresh start from scratch)."""
    work_dir = tmp_path / 'run'
    _stopped(work_dir, 8)
    _damage(work_dir / 'iter_9.pth', 'cut short')
    (work_dir / 'epoch_1.pth').unlink()
    cfg = _cfg(work_dir)
    cfg.resume = 'auto'
    with pytest.raises(
            ValueError,
            match='no other whole training '
            'checkpoint.*delete .*last_checkpoint'):
        _train(cfg)
    cfg = _cfg(work_dir)
    cfg.resume, cfg.load_from = True, str(work_dir / 'iter_9.pth')
    with pytest.raises(ValueError, match='iter_9.pth, is cut short'):
        _train(cfg)


def test_a_second_signal_during_the_save_is_harmless(tmp_path):
    """SIGTERM arrives while the checkpoint SIGUSR1 asked for is being
    written: the request only repeats; the run stops as SIGUSR1 asked, with
    one whole checkpoint that resumes."""
    work_dir = tmp_path / 'run'
    with pytest.raises(SystemExit) as stopped:
        _train(
            _cfg(
                work_dir,
                extra_hooks=[
                    dict(type='SignalAtIterationHook', iteration=4),
                    dict(type='SignalDuringSaveHook', signum=signal.SIGTERM)
                ]))
    assert stopped.value.code == 128 + signal.SIGUSR1
    assert sorted(p.name for p in work_dir.glob('*.pth')) == ['iter_5.pth']
    torch.load(work_dir / 'iter_5.pth', weights_only=True)
    cfg = _cfg(work_dir)
    cfg.resume = 'auto'
    assert _train(cfg).iter == 3 * ITERS_PER_EPOCH


def test_a_save_killed_midway_leaves_the_previous_checkpoint(
        tmp_path, monkeypatch):
    """A checkpoint is renamed into place only once whole: a process that
    dies while writing leaves no file under the checkpoint's name, and
    ``last_checkpoint`` names the previous one; what the failed save wrote
    is removed (a full disk keeps the room for the next save). The
    control, MMEngine's ``Runner.save_checkpoint``, leaves the truncated
    file there."""
    import mmengine.runner.runner as runner_module
    from mmengine.runner import Runner
    runner = _train(_cfg(tmp_path))
    written = []

    def dies_midway(checkpoint, path, **kwargs):
        with open(path, 'wb') as f:
            f.write(b'half a checkpoint')
        written.append(path)
        raise KeyboardInterrupt('killed while saving')

    monkeypatch.setattr(runner_module, 'save_checkpoint', dies_midway)
    with pytest.raises(KeyboardInterrupt):
        runner.save_checkpoint(str(tmp_path), 'epoch_4.pth')
    assert written and not osp.exists(tmp_path / 'epoch_4.pth')
    assert not osp.exists(written[0])  # the part written is freed
    with open(tmp_path / 'last_checkpoint') as f:
        assert f.read().strip().endswith('epoch_3.pth')
    with pytest.raises(KeyboardInterrupt):
        Runner.save_checkpoint(runner, str(tmp_path), 'epoch_4.pth')
    assert open(tmp_path / 'epoch_4.pth', 'rb').read() == b'half a checkpoint'
