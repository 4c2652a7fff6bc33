"""A signal to a 2-rank ``tools/dist_train.sh`` run (no Slurm needed):
every rank stops at the same iteration, one checkpoint is written, and the
run resumed with ``--resume`` (on ranks forked as dist_train.sh starts
them) ends exactly where the uninterrupted run ends: the same samples,
augmentation and learning rates on each rank, and the same weights and
EMA bit for bit.

``SIGUSR1`` goes to the launcher script alone (it passes it to the ranks;
torchrun would die of it), ``SIGTERM`` to the whole process group, as
Slurm signals every process of a job step.
"""
import os
import os.path as osp
import signal
import sys

import pytest

from mmddp_ext.testing import free_port
from mmddp_ext.utils import load_checkpoint_file
from ...helpers import REPO_ROOT, train_on_ranks
from .runs import (CONFIG, ITERS, RUN_TIMEOUT_S, finish, same_run,
                   start_launcher, toy_options, train_uninterrupted,
                   wait_for_lines)


def _launch(work_dir, options):
    cmd = [
        'bash',
        osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), CONFIG, '2',
        '--work-dir',
        str(work_dir), '--cfg-options', *options
    ]
    return start_launcher(
        cmd, dict(os.environ, PORT=str(free_port()), PYTHON=sys.executable))


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    return train_uninterrupted(str(tmp_path_factory.mktemp('uninterrupted')))


@pytest.mark.parametrize('signum, whole_group', [
    (signal.SIGUSR1, False),
    (signal.SIGTERM, True),
])
def test_signal_checkpoints_and_resume_is_exact(tmp_path, uninterrupted,
                                                signum, whole_group):
    work_dir = str(tmp_path / 'run')
    proc = _launch(work_dir, toy_options(work_dir, delay=0.4))
    # once rank 0 has trained 4 iterations (the second epoch's first): the
    # ranks stop at the end of the iteration they are in
    if wait_for_lines(work_dir, 4, proc):
        (os.killpg if whole_group else os.kill)(proc.pid, signum)
    code, out = finish(proc)
    name = signal.Signals(signum).name
    assert code != 0, out[-4000:]
    # one line per rank for the signal's stop, the same iteration on each
    stops = [
        line for line in out.splitlines()
        if f'PreemptionHook: {name}: rank' in line
    ]
    assert len(stops) == 2, out[-6000:]
    stopped_at = {
        line.split('after iteration ')[1].split()[0]
        for line in stops
    }
    assert len(stopped_at) == 1, stops
    trained = int(stopped_at.pop())
    assert 4 <= trained < ITERS, stops
    with open(osp.join(work_dir, 'last_checkpoint')) as f:
        assert f.read().strip() == osp.join(work_dir, f'iter_{trained}.pth')
    assert 'to resume, run the same command with --resume' in out
    assert not any(f.endswith('.partial') for f in os.listdir(work_dir))

    resumed = train_on_ranks(
        CONFIG,
        2,
        work_dir,
        toy_options(work_dir),
        extra_args=['--resume'],
        timeout=RUN_TIMEOUT_S)
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    assert (f'resuming from {work_dir}/iter_{trained}.pth'
            in resumed.stdout)
    assert same_run(work_dir, uninterrupted)
    # --resume on torch 2.13 (weights_only=True) kept the optimizer's
    # momentum and the logged loss history: one entry per iteration
    final = load_checkpoint_file(osp.join(work_dir, f'epoch_{ITERS // 3}.pth'))
    assert final['meta']['iter'] == ITERS
    assert all('momentum_buffer' in state
               for state in final['optimizer']['state'].values())
    history = final['message_hub']['log_scalars']['train/loss']
    assert len(history['log_history']) == ITERS
