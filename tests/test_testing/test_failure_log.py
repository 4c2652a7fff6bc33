"""``--failure-log PATH`` / ``MMDDP_EXT_FAILURE_LOG`` (tests/failure_log.py):
a failing test's report is in the file while the run goes on, so a run
killed at its time limit still says why. An inner pytest, with this
repository's conftest, runs a test that fails and one that sleeps until
it is killed."""
import os
import os.path as osp
import signal
import subprocess
import sys
import time

import pytest

from tests.failure_log import FAILURE_LOG_ENV

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
WAIT_S = 90
FAILING = """
def test_fails_with_its_reason():
    reason = 'the reason this test failed'
    assert reason == 'no reason', reason
"""
SLEEPING = """
import time


def test_sleeps_until_killed():
    time.sleep(600)
"""


def _run_until(tmp_path, args, env, done):
    """Start the inner pytest; once ``done(log_text, output)`` holds (or
    after ``WAIT_S``), kill it with everything it started. Returns the
    failure log's text, the output so far and whether the run was still
    going then."""
    (tmp_path / 'conftest.py').write_text(
        'from tests.conftest import *  # noqa: F401,F403\n')
    (tmp_path / 'test_a_fails.py').write_text(FAILING)
    (tmp_path / 'test_b_sleeps.py').write_text(SLEEPING)
    log, output = tmp_path / 'failures.log', tmp_path / 'output.txt'
    run_env = {k: v for k, v in os.environ.items() if k != FAILURE_LOG_ENV}
    run_env.update(env, PYTHONPATH=REPO_ROOT)
    with open(output, 'w') as out:
        proc = subprocess.Popen(
            [sys.executable, '-m', 'pytest', '-v', '-p', 'no:cacheprovider',
             '-o', 'timeout=0', *args, str(tmp_path)],
            cwd=str(tmp_path), env=run_env, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + WAIT_S
    try:
        while True:
            text = log.read_text() if log.exists() else ''
            printed = output.read_text()
            if done(text, printed) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        running = proc.poll() is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return text, printed, running


def _logged(text, printed):
    return 'test_fails_with_its_reason' in text


@pytest.mark.parametrize('how', ['env-one-process', 'option-xdist'])
def test_a_failure_is_logged_while_the_run_goes_on(tmp_path, how):
    log = str(tmp_path / 'failures.log')
    if how == 'env-one-process':
        args, env = [], {FAILURE_LOG_ENV: log}
    else:  # as tools/run_tests.sh runs the suite (one worker is enough:
        # the controller writes what the worker reports)
        args, env = ['--failure-log', log, '-n', '1', '--dist',
                     'loadfile'], {}
    text, printed, running = _run_until(tmp_path, args, env, _logged)
    assert running, printed  # the sleeping test still sleeps
    assert 'FAILED test_a_fails.py::test_fails_with_its_reason' in text
    assert 'the reason this test failed' in text  # the assertion message
    assert "assert reason == 'no reason'" in text  # the traceback's line
    assert 'test_sleeps_until_killed' not in text


def test_without_the_log_a_killed_run_does_not_say_why(tmp_path):
    """Negative control: pytest prints tracebacks at the end of the run,
    which a killed run never reaches; the test is shown failed, not why."""
    def sleeping(text, printed):
        return 'test_sleeps_until_killed' in printed

    text, printed, running = _run_until(tmp_path, [], {}, sleeping)
    assert running and sleeping(text, printed), printed
    assert 'test_fails_with_its_reason FAILED' in printed
    assert 'the reason this test failed' not in printed
    assert not (tmp_path / 'failures.log').exists()
