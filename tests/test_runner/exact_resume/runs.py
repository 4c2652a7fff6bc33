"""What the launcher-level exact-resume tests (tools/dist_train.sh and
Slurm) share: the toy run's options, waiting on it, and comparing its
end with another run's."""
import os.path as osp
import subprocess
import time

import pytest
import torch

from mmddp_ext.testing import kill_process_tree
from ...helpers import REPO_ROOT, train_on_ranks
from .toy import read_trained

CONFIG = osp.join(REPO_ROOT, 'tests', 'test_runner', 'exact_resume',
                  'toy_config.py')
ITERS = 9  # 3 epochs of 3 iterations per rank on 2 ranks
RUN_TIMEOUT_S = 180


def toy_options(work_dir, delay=0.0, exact=True):
    """``--cfg-options`` of a toy run logging into ``work_dir``, sleeping
    ``delay`` s per step (time for a test to signal mid-run)."""
    return [
        f'model.log_dir={work_dir}', f'model.step_delay={delay}',
        f'custom_hooks.1.log_dir={work_dir}',
        f'mmddp_ext_cfg.exact_resume={exact}'
    ]


def finish(proc, timeout=RUN_TIMEOUT_S):
    """``proc``'s exit code and output; its whole tree killed past
    ``timeout``."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_process_tree(proc.pid)
        out, _ = proc.communicate()
        pytest.fail(f'did not end in {timeout}s:\n{out[-6000:]}')
    return proc.returncode, out


def trained_lines(work_dir, rank=0) -> int:
    """Iterations ``rank`` has trained so far."""
    path = osp.join(work_dir, f'trained_rank{rank}.jsonl')
    if not osp.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for _ in f)


def wait_for_lines(work_dir, count, proc=None, timeout=RUN_TIMEOUT_S,
                   rank=0) -> bool:
    """Wait until ``rank`` has trained ``count`` iterations; False when
    ``proc`` ended first."""
    deadline = time.monotonic() + timeout
    while trained_lines(work_dir, rank) < count:
        if proc is not None and proc.poll() is not None:
            return False
        assert time.monotonic() < deadline, f'{work_dir}: no progress'
        time.sleep(0.05)
    return True


def final_state(work_dir):
    """Weights and EMA of the run's last epoch checkpoint."""
    checkpoint = torch.load(
        osp.join(work_dir, f'epoch_{ITERS // 3}.pth'),
        map_location='cpu',
        weights_only=True)
    return checkpoint['state_dict'], checkpoint['ema_state_dict']


def same_run(work_dir, reference) -> bool:
    """Whether two 2-rank toy runs trained the same samples with the same
    augmentation, learning rate and momentum at every iteration on each
    rank and ended with the same weights and EMA, bit for bit."""
    for rank in range(2):
        trained = read_trained(work_dir, rank)
        assert trained and all('lr' in r for r in trained), 'no schedule'
        if trained != read_trained(reference, rank):
            return False
    weights, ema = final_state(work_dir)
    expected_weights, expected_ema = final_state(reference)
    return all(
        torch.equal(weights[k], expected_weights[k])
        for k in expected_weights) and all(
            torch.equal(ema[k], expected_ema[k]) for k in expected_ema)


def start_launcher(command, env):
    """A launcher script (dist_train.sh, slurm_train.sh) in its own process
    group, from the repository root, its output captured."""
    return subprocess.Popen(
        command,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)


def train_uninterrupted(work_dir) -> str:
    """The reference: the toy run on 2 ranks, never stopped."""
    result = train_on_ranks(
        CONFIG, 2, work_dir, toy_options(work_dir), timeout=RUN_TIMEOUT_S)
    assert result.returncode == 0, result.stdout[-6000:]
    return work_dir
