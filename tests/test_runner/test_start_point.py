"""Where a run starts (issue 28): the rule itself, and tools/train.py's
``--resume``, ``--resume PATH`` and a config's ``resume=True`` through
ExtRunner in one process, each against what stock MMEngine does."""
import os.path as osp

import pytest
import torch

from mmddp_ext.runner.start_point import (RECORD, StartPoint, checkpoint_stamp,
                                          choose_start)

from ..test_wrappers.auto_ddp_tiny import LogCapture

CONFIG = osp.join(
    osp.dirname(osp.dirname(osp.abspath(__file__))), 'test_tools',
    'self_healing_toy.py')
FRESH = 'the load_from of a new run (resume is off)'


# ---------------------------------------------------------------- the rule
def test_new_run_loads_load_from_and_records_the_work_dir():
    start, record = choose_start(False, 'pre.pth', ['old/iter_9.pth', 1, 2])
    assert start == StartPoint('load', 'pre.pth', FRESH)
    assert record['latest'] == ['old/iter_9.pth', 1, 2]
    assert record['weights'] == 'pre.pth'


def test_restart_continues_from_its_own_checkpoint_only():
    _, record = choose_start(False, 'pre.pth', ['w/iter_9.pth', 1, 2])
    # The checkpoint an earlier run left is not this run's own...
    start, kept = choose_start(
        False, 'pre.pth', ['w/iter_9.pth', 1, 2], restart=1, record=record)
    assert (start.action, start.path, kept) == ('load', 'pre.pth', None)
    assert start.why == ('this run has written no checkpoint yet, so it '
                         f'starts again as it started: {FRESH}')
    # ...a file this run wrote, even under the same name, is.
    start, _ = choose_start(
        False, 'pre.pth', ['w/iter_9.pth', 5, 2], restart=1, record=record)
    assert start == StartPoint('resume', 'w/iter_9.pth',
                               'the latest checkpoint this run wrote')


@pytest.mark.parametrize('variable', ['TORCHELASTIC_RESTART_COUNT',
                                      'SLURM_RESTART_COUNT'])
def test_a_slurm_requeue_is_a_restart(monkeypatch, variable):
    """A requeued Slurm job runs its batch script again with the command it
    was submitted with (no --resume) and SLURM_RESTART_COUNT set: the rule
    treats it as torchrun's restart, so a fine-tune requeued before its
    first checkpoint loads its load_from again and one requeued after a
    checkpoint resumes it. The control: without the count the requeued
    job is a new run, from load_from."""
    from mmddp_ext.runner.start_point import restart_count
    for name in ('TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT'):
        monkeypatch.delenv(name, raising=False)
    _, record = choose_start(False, 'pre.pth', None)
    assert restart_count() == 0
    written = ['w/iter_7.pth', 1, 2]
    start, _ = choose_start(False, 'pre.pth', written,
                            restart=restart_count(), record=record)
    assert start == StartPoint('load', 'pre.pth', FRESH)  # the control
    monkeypatch.setenv(variable, '1')
    assert restart_count() == 1
    start, _ = choose_start(False, 'pre.pth', written,
                            restart=restart_count(), record=record)
    assert start == StartPoint('resume', 'w/iter_7.pth',
                               'the latest checkpoint this run wrote')
    start, _ = choose_start(False, 'pre.pth', None,
                            restart=restart_count(), record=record)
    assert (start.action, start.path) == ('load', 'pre.pth')


def test_a_record_of_other_settings_is_not_this_runs():
    _, record = choose_start(False, 'other.pth', None)
    start, new = choose_start(
        False, 'pre.pth', ['w/iter_2.pth', 1, 2], restart=1, record=record)
    assert start == StartPoint('load', 'pre.pth', FRESH)
    assert new['inputs'] == dict(resume=False, load_from='pre.pth')


def test_resume_path_and_auto_follow_the_same_rule():
    # --resume PATH: that checkpoint, again after a restart without one of
    # its own, and the run's own once it wrote one.
    start, record = choose_start(True, 'w/iter_4.pth', ['w/iter_8.pth', 1, 1])
    assert (start.action, start.path) == ('resume', 'w/iter_4.pth')
    again, _ = choose_start(True, 'w/iter_4.pth', ['w/iter_8.pth', 1, 1], 1,
                            record)
    assert (again.action, again.path) == ('resume', 'w/iter_4.pth')
    own, _ = choose_start(True, 'w/iter_4.pth', ['w/iter_6.pth', 3, 1], 1,
                          record)
    assert (own.action, own.path) == ('resume', 'w/iter_6.pth')
    # --resume (auto): the latest checkpoint, else load_from.
    assert choose_start('auto', 'pre.pth', ['w/iter_2.pth', 1, 1])[0] == \
        StartPoint('resume', 'w/iter_2.pth',
                   'the latest checkpoint in the work dir')
    assert choose_start('auto', 'pre.pth', None)[0] == StartPoint(
        'load', 'pre.pth',
        'no checkpoint in the work dir yet, so the run starts from load_from')


def test_resume_true_with_weights_only_load_from_continues_the_run():
    weights_only = dict(is_training_checkpoint=lambda path: False)
    start, _ = choose_start(True, 'pre.pth', None, **weights_only)
    assert (start.action, start.path) == ('load', 'pre.pth')
    assert start.why.startswith('load_from holds weights only')
    start, _ = choose_start(True, 'pre.pth', ['w/iter_2.pth', 1, 1],
                            **weights_only)
    assert (start.action, start.path) == ('resume', 'w/iter_2.pth')


def test_mmdet_resume_without_load_from_finds_the_recorded_weights():
    _, record = choose_start(False, 'pre.pth', None)
    start, new = choose_start(True, None, None, record=record)
    assert (start.action, start.path) == ('load', 'pre.pth')
    assert RECORD in start.why
    assert new['weights'] == 'pre.pth'
    assert choose_start(True, None, None)[0].action == 'scratch'


@pytest.mark.parametrize('resume', ['yes', 1, 'w/iter_4.pth'])
def test_unknown_resume_values_are_refused(resume):
    with pytest.raises(
            ValueError,
            match=r"resume must be one of \(False, "
            r"True, 'auto'\), but got"):
        choose_start(resume, None, None)


def test_stamp_tells_a_rewritten_file(tmp_path):
    path = str(tmp_path / 'iter_1.pth')
    assert checkpoint_stamp(None) is None
    assert checkpoint_stamp(path) == [path, None, None]
    torch.save({}, path)
    first = checkpoint_stamp(path)
    torch.save({'a': torch.zeros(3)}, path)
    assert checkpoint_stamp(path) != first


# ------------------------------------------------------- tools/train.py
def _pretrained(path: str) -> str:
    """Weights only (``meta`` and ``state_dict``, as a published model),
    with a bias far from a fresh model's."""
    from tests.test_tools.self_healing_parts import SelfHealingToyModel
    model = SelfHealingToyModel()
    with torch.no_grad():
        model.linear.bias.fill_(7.0)
    torch.save(
        dict(meta=dict(epoch=12, iter=90000), state_dict=model.state_dict()),
        path)
    return path


def _train(work_dir, *args, options=(), iters=2):
    """tools/train.py in this process (no launcher); the runner and what
    its logger logged."""
    from tools import train
    argv = [
        CONFIG, '--work-dir', work_dir, *args, '--cfg-options',
        f'train_cfg.max_iters={iters}', 'default_hooks.checkpoint.interval=2',
        'custom_hooks=[]', 'env_cfg.dist_cfg.backend=gloo', *options
    ]
    runners, captures = [], []

    def prepare(runner):
        runners.append(runner)
        captures.append(LogCapture())

    try:
        train.run(train.build_cfg, train.parse_args(argv), prepare=prepare)
    finally:
        for capture in captures:
            capture.close()
    return runners[0], '\n'.join(captures[0].messages)


def _bias(runner) -> float:
    return float(runner.model.linear.bias)


def test_resume_flag_keeps_load_from_then_resumes_the_run(tmp_path):
    work = str(tmp_path / 'work')
    pre = _pretrained(str(tmp_path / 'pre.pth'))
    runner, log = _train(work, '--resume', options=[f'load_from={pre}'])
    assert ('ExtRunner (rank 0/1): loading the weights of '
            f'{pre} (training starts at iteration 0): no checkpoint in the '
            'work dir yet, so the run starts from load_from.') in log
    assert abs(_bias(runner) - 7.0) < 0.5  # fine-tuned from pre, 2 steps
    runner, log = _train(
        work, '--resume', options=[f'load_from={pre}'], iters=4)
    assert (f'resuming from {work}/iter_2.pth: the latest checkpoint in the '
            'work dir.') in log
    assert f'Load checkpoint from {pre}' not in log
    assert runner.iter == 4


def test_mmdet_resume_encoding_drops_the_pretrained_start(tmp_path):
    """Negative control: MMDetection's --resume (resume=True,
    load_from=None), which tools/train.py applied after a restart, under
    stock MMEngine: no checkpoint yet, so nothing is loaded. ExtRunner
    finds the weights the run started from in the work dir's record."""
    pre = _pretrained(str(tmp_path / 'pre.pth'))
    for runner_type in ('Runner', 'ExtRunner'):
        work = str(tmp_path / runner_type)
        # The first launch is killed before its first checkpoint.
        _train(
            work,
            options=[
                f'load_from={pre}', 'train_cfg.max_iters=1',
                'default_hooks.checkpoint.save_last=False',
                f'runner_type={runner_type}'
            ])
        runner, log = _train(
            work,
            options=[
                'resume=True', 'load_from=None', f'runner_type={runner_type}'
            ])
        if runner_type == 'Runner':
            assert 'Auto resumed from the latest checkpoint None.' in log
            assert abs(_bias(runner)) < 1.5  # a fresh model's
        else:
            assert (f'loading the weights of {pre} (training starts at '
                    'iteration 0): no checkpoint in the work dir yet and '
                    'load_from is unset') in log
            assert abs(_bias(runner) - 7.0) < 0.5


def test_resume_path_resumes_that_checkpoint(tmp_path):
    work = str(tmp_path / 'work')
    _train(work, iters=4)
    path = osp.join(work, 'iter_2.pth')
    runner, log = _train(work, '--resume', path, iters=4)
    assert (f'resuming from {path}: resume=True with load_from, a training '
            'checkpoint (as --resume PATH).') in log
    assert 'resumed epoch: 0, iter: 2' in log and runner.iter == 4


def test_config_resume_true_with_pretrained_weights(tmp_path):
    """``resume=True`` with a published model as ``load_from``: ExtRunner
    fine-tunes from it from iteration 0. Negative control: stock MMEngine
    resumes it as a training checkpoint and stops on what it lacks."""
    pre = _pretrained(str(tmp_path / 'pre.pth'))
    options = ['resume=True', f'load_from={pre}']
    runner, log = _train(str(tmp_path / 'ext'), options=options)
    assert 'load_from holds weights only' in log
    assert runner.iter == 2 and abs(_bias(runner) - 7.0) < 0.5
    with pytest.raises(KeyError, match='message_hub'):
        _train(
            str(tmp_path / 'stock'), options=options + ['runner_type=Runner'])
