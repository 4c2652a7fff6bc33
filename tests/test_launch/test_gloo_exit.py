"""A rank exits cleanly while gloo's worker threads still hold a finished
collective (``release_gloo_work_before_exit``).

The abort it prevents ("terminate called without an active exception",
SIGABRT after training finished) depends on thread timing: in a 2-rank
loop under torchrun it hit 9 of about 190 exits without the grace and 0 of
100 with it (README, "CPU or GPU launch"). Within a test's time it cannot
be produced on demand, so the negative control here is on the mechanism:
without the grace, nothing runs between the last Python code and the
interpreter's finalisation with the GIL released.
"""
import os
import os.path as osp
import subprocess
import sys
import threading
import time

import pytest

from mmddp_ext.launch import process_group as dist_env
from mmddp_ext.testing import free_port, kill_process_tree
from ..helpers import REPO_ROOT

SCRIPT = osp.join(osp.dirname(osp.abspath(__file__)), 'gloo_exit_rank.py')
# Quiet machine: about 10 s (imports); 3x and more.
TIMEOUT = 90


@pytest.mark.multi_rank  # starts its ranks itself
def test_a_rank_exits_cleanly_with_a_collective_finishing_at_exit(tmp_path):
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
            PYTHONPATH=REPO_ROOT)
        log = open(tmp_path / f'rank{rank}.log', 'w')
        procs.append((subprocess.Popen([sys.executable, SCRIPT], env=env,
                                       stdout=log, stderr=subprocess.STDOUT,
                                       cwd=REPO_ROOT), log))
    deadline = time.monotonic() + TIMEOUT
    codes, texts = [], []
    for rank, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            kill_process_tree(proc.pid)
            proc.wait()
        log.close()
        texts.append((tmp_path / f'rank{rank}.log').read_text())
        codes.append(proc.returncode)
    assert 'rank 0: exit grace registered: True' in texts[0], texts[0]
    assert 'rank 0: leaving with an all-reduce in flight' in texts[0]
    assert 'rank 1: all-reduce done (2)' in texts[1], texts[1]
    assert codes == [0, 0], texts
    assert 'terminate called' not in texts[0]


def _gil_released_during(call) -> int:
    """How often a Python thread ran while ``call()`` ran."""
    runs, stop = [0], threading.Event()

    def spin():
        while not stop.is_set():
            runs[0] += 1
            time.sleep(0.001)

    thread = threading.Thread(target=spin)
    thread.start()
    time.sleep(0.05)  # started and sleeping
    before = runs[0]
    call()
    during = runs[0] - before
    stop.set()
    thread.join()
    return during


def test_the_exit_grace_releases_the_gil_and_off_does_not(monkeypatch):
    registered = []
    monkeypatch.setattr(dist_env, '_exit_grace_registered', False)
    monkeypatch.setattr(dist_env.atexit, 'register', registered.append)
    dist_env.release_gloo_work_before_exit()
    dist_env.release_gloo_work_before_exit()
    assert registered == [dist_env._gloo_exit_grace]  # once per process
    assert dist_env.GLOO_EXIT_GRACE_S > 0
    monkeypatch.delenv(dist_env.GLOO_EXIT_GRACE_ENV, raising=False)
    assert _gil_released_during(dist_env._gloo_exit_grace) >= 10
    # Negative control: switched off, the handler gives other threads no
    # time before finalisation.
    monkeypatch.setenv(dist_env.GLOO_EXIT_GRACE_ENV, '0')
    assert _gil_released_during(dist_env._gloo_exit_grace) <= 1


@pytest.mark.parametrize('value', ['0.2s', 'abc', '-1', 'nan', 'inf'])
def test_a_malformed_grace_fails_at_registration_not_at_exit(
        monkeypatch, value):
    registered = []
    monkeypatch.setattr(dist_env, '_exit_grace_registered', False)
    monkeypatch.setattr(dist_env.atexit, 'register', registered.append)
    monkeypatch.setenv(dist_env.GLOO_EXIT_GRACE_ENV, value)
    with pytest.raises(ValueError, match='MMDDP_EXT_GLOO_EXIT_GRACE_S'):
        dist_env.release_gloo_work_before_exit()
    assert registered == []
    for good, seconds in (('', dist_env.GLOO_EXIT_GRACE_S), ('0', 0.0),
                          (' 1.5 ', 1.5)):
        monkeypatch.setenv(dist_env.GLOO_EXIT_GRACE_ENV, good)
        assert dist_env.gloo_exit_grace_s() == seconds
