"""Each failing test's report written to a file the moment it fails.

``pytest --failure-log PATH`` (or ``MMDDP_EXT_FAILURE_LOG=PATH``) appends
the test id and the full report (traceback, captured output, every rank's
log that :class:`~mmddp_ext.testing.MultiRankError` carries) of every
failed test, setup or teardown error and collection error to ``PATH``,
written and closed at once. pytest prints its tracebacks only at the end
of a session, so a run stopped at its time limit (``timeout 900 pytest``,
a CI job's limit) would otherwise say nothing about why its tests failed.

Under pytest-xdist only the controller writes: every worker report
reaches it as soon as the worker has it, and a single writer keeps the
reports whole.
"""
import os
import time

FAILURE_LOG_ENV = 'MMDDP_EXT_FAILURE_LOG'
PLUGIN_NAME = 'mmddp_ext_failure_log'


def add_failure_log_option(parser) -> None:
    """``--failure-log PATH`` (default: ``$MMDDP_EXT_FAILURE_LOG``)."""
    parser.addoption(
        '--failure-log',
        metavar='PATH',
        default=os.environ.get(FAILURE_LOG_ENV) or None,
        help='append each failed or erroring test\'s id and full report '
        'to PATH as soon as it fails (so a run cut at its time limit '
        f'still says why). Defaults to ${FAILURE_LOG_ENV}.')


def register_failure_log(config) -> None:
    """Register the writer when a path is given, in the process that
    receives every report (not in an xdist worker)."""
    path = config.getoption('--failure-log')
    if not path or hasattr(config, 'workerinput'):
        return
    config.pluginmanager.register(FailureLog(path), PLUGIN_NAME)


def _append(path: str, text: str) -> None:
    """One ``O_APPEND`` write, closed at once (nothing waits in a buffer
    for a process that is killed)."""
    data = text.encode('utf-8', errors='replace')
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        while data:
            data = data[os.write(fd, data):]
    finally:
        os.close(fd)


class FailureLog:
    """pytest plugin: append failing reports to ``path`` (see above)."""

    def __init__(self, path: str):
        self.path = os.path.abspath(path)

    def pytest_sessionstart(self, session):
        args = ' '.join(session.config.invocation_params.args)
        _append(self.path, f'===== session started {_now()} (pid '
                f'{os.getpid()}): pytest {args}\n')

    def pytest_runtest_logreport(self, report):
        if not report.failed:
            return
        what = 'FAILED' if report.when == 'call' else (
            f'ERROR at {report.when}')
        self._write(what, report)

    def pytest_collectreport(self, report):
        if report.failed:
            self._write('ERROR collecting', report)

    def _write(self, what: str, report) -> None:
        where = getattr(report, 'node', None)
        worker = getattr(getattr(where, 'gateway', None), 'id', None)
        head = f'===== {what} {report.nodeid} ({_now()}'
        head += f', worker {worker})' if worker else ')'
        parts = [head, report.longreprtext]
        for name, content in report.sections:
            parts.append(f'----- {name}\n{content}')
        _append(self.path, '\n'.join(parts) + '\n')


def _now() -> str:
    return time.strftime('%Y-%m-%d %H:%M:%S')
