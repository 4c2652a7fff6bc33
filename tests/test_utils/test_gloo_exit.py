"""A rank exits cleanly while gloo's worker threads still hold a finished
collective (``release_gloo_work_before_exit``).

Without the exit grace the same scenario aborts the process the way users
saw it in runs that had finished training: ``terminate called without an
active exception`` and SIGABRT. Both pairs of ranks are plain processes,
not torchrun, so nothing kills or hides a rank; they run side by side.
"""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

from mmddp_ext.testing import free_port, kill_process_tree
from mmddp_ext.utils.dist_env import GLOO_EXIT_GRACE_ENV
from ..helpers import REPO_ROOT

SCRIPT = osp.join(osp.dirname(osp.abspath(__file__)), 'gloo_exit_rank.py')
# Quiet machine: about 12 s for both pairs (imports); 3x and more.
TIMEOUT = 90


def start_pair(grace: str, log_dir: str):
    port = free_port()
    procs = []
    for rank in (0, 1):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE='2',
            LOCAL_WORLD_SIZE='2',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(port),
            OMP_NUM_THREADS='1',
            PYTHONPATH=REPO_ROOT,
            **{GLOO_EXIT_GRACE_ENV: grace})
        log = open(osp.join(log_dir, f'grace{grace}_rank{rank}.log'), 'w')
        procs.append((subprocess.Popen([sys.executable, SCRIPT], env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       cwd=REPO_ROOT), log))
    return procs


def finish(procs, deadline: float):
    codes, texts = [], []
    for proc, log in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_process_tree(proc.pid)
            proc.wait()
        log.close()
        with open(log.name) as f:
            texts.append(f.read())
        codes.append(proc.returncode)
    return codes, texts


def test_a_rank_exits_cleanly_with_gloo_work_finishing(tmp_path):
    deadline = time.monotonic() + TIMEOUT
    with_grace = start_pair('3', str(tmp_path))
    without = start_pair('0', str(tmp_path))
    codes, texts = finish(with_grace, deadline)
    off_codes, off_texts = finish(without, deadline)
    assert time.monotonic() < deadline, 'a rank hung'
    # Every rank of both pairs got as far as the collective.
    for text in (texts[0], off_texts[0]):
        assert 'rank 0: leaving with an all-reduce in flight' in text, text
    for text in (texts[1], off_texts[1]):
        assert 'rank 1: all-reduce done (2)' in text, text
    # The mechanism: rank 0 exits 0, both ranks.
    assert codes == [0, 0], texts
    # Negative control: the grace off, rank 0 aborts at exit.
    assert off_codes[1] == 0, off_texts[1]
    assert off_codes[0] == -signal.SIGABRT, off_texts[0]
    assert 'terminate called without an active exception' in off_texts[0]
