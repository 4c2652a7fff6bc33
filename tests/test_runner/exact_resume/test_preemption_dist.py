"""A signal to a 2-rank ``tools/dist_train.sh`` run (no Slurm needed):
every rank stops at the same iteration, one checkpoint is written, and the
run resumed with ``--resume`` (on ranks forked as dist_train.sh starts
them) ends exactly where the uninterrupted run ends: the same samples, augmentation and learning rates on each rank, and
the same weights and EMA bit for bit.

``SIGUSR1`` goes to the launcher script alone (it passes it to the ranks;
torchrun would die of it), ``SIGTERM`` to the whole process group, as
Slurm signals every process of a job step.
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest
import torch

from mmddp_ext.testing import free_port, kill_process_tree
from ...helpers import REPO_ROOT, train_on_ranks
from .toy import read_trained

CONFIG = osp.join(osp.dirname(__file__), 'toy_config.py')
ITERS = 9  # 3 epochs of 3 iterations per rank
RUN_TIMEOUT_S = 150


def _options(work_dir, delay=0.0, exact=True):
    return [
        f'model.log_dir={work_dir}', f'model.step_delay={delay}',
        f'mmddp_ext_cfg.exact_resume={exact}'
    ]


def _launch(work_dir, options, resume=False):
    cmd = [
        'bash',
        osp.join(REPO_ROOT, 'tools',
                 'dist_train.sh'), CONFIG, '2', '--work-dir',
        str(work_dir), *(['--resume'] if resume else []), '--cfg-options',
        *options
    ]
    env = dict(os.environ, PORT=str(free_port()), PYTHON=sys.executable)
    return subprocess.Popen(
        cmd,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)


def _finish(proc, timeout=RUN_TIMEOUT_S):
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f'run did not end in {timeout}s:\n{out[-6000:]}')
    return proc.returncode, out


def _trained_lines(work_dir, rank=0):
    path = osp.join(work_dir, f'trained_rank{rank}.jsonl')
    if not osp.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def _signal_mid_epoch(proc, work_dir, signum, whole_group):
    """Signal once rank 0 has trained 4 iterations (the second epoch's
    first); the ranks stop at the end of the iteration they are in."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while _trained_lines(work_dir) < 4:
        if proc.poll() is not None or time.monotonic() > deadline:
            return
        time.sleep(0.05)
    if whole_group:
        os.killpg(proc.pid, signum)
    else:
        os.kill(proc.pid, signum)


def _final(work_dir):
    checkpoint = torch.load(
        osp.join(work_dir, f'epoch_{ITERS // 3}.pth'),
        map_location='cpu',
        weights_only=True)
    return checkpoint['state_dict'], checkpoint['ema_state_dict']


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    work_dir = str(tmp_path_factory.mktemp('uninterrupted'))
    result = train_on_ranks(
        CONFIG, 2, work_dir, _options(work_dir), timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-6000:]
    return work_dir


@pytest.mark.parametrize('signum, whole_group', [
    (signal.SIGUSR1, False),
    (signal.SIGTERM, True),
])
def test_signal_checkpoints_and_resume_is_exact(tmp_path, uninterrupted,
                                                signum, whole_group):
    work_dir = str(tmp_path / 'run')
    proc = _launch(work_dir, _options(work_dir, delay=0.4))
    _signal_mid_epoch(proc, work_dir, signum, whole_group)
    code, out = _finish(proc)
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
    assert not any(name.endswith('.partial') for name in os.listdir(work_dir))

    # the resume as tools/dist_train.sh starts it, on forked ranks
    resumed = train_on_ranks(CONFIG, 2, work_dir, _options(work_dir),
                             extra_args=['--resume'], timeout=RUN_TIMEOUT_S)
    code, out = resumed.returncode, resumed.stdout
    assert code == 0, out[-6000:]
    assert f'resuming from {work_dir}/iter_{trained}.pth' in out
    for rank in range(2):
        assert read_trained(work_dir,
                            rank) == read_trained(uninterrupted,
                                                  rank), f'rank {rank}'
    weights, ema = _final(work_dir)
    expected_weights, expected_ema = _final(uninterrupted)
    for key in expected_weights:
        assert torch.equal(weights[key], expected_weights[key]), key
    for key in expected_ema:
        assert torch.equal(ema[key], expected_ema[key]), f'EMA {key}'
