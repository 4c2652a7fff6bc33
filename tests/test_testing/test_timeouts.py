"""Inner timeouts detect hangs before pytest's global timeout does, so a
hang fails with every rank's log and its processes are cleaned up by
``run_on_ranks``/``run_command`` rather than by pytest; and every test's
pytest-timeout limit is at least 3x the time the test took in a measured
run of the suite (``tests/file_durations.json``), so a busy machine does
not turn a slow test into a failure."""
import ast
import configparser
import glob
import os.path as osp

from tests.conftest import TEST_LIMITS
from tests.file_order import RECORDED_TEST_S, load_test_durations

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# Spawning ranks and reporting take a few seconds beyond the timeout.
MARGIN_S = 20
# A limit is at least this many times what it bounds. The recorded times
# are the suite's own (four workers on 2 cores), longer than the quiet
# times the rule speaks of, so the check errs on the safe side.
LIMIT_FACTOR = 3


def global_timeout():
    parser = configparser.ConfigParser()
    parser.read(osp.join(REPO_ROOT, 'setup.cfg'))
    return float(parser['tool:pytest']['timeout'])


def timeouts_per_function(source, filename='<test>'):
    """``{function name: [literal timeout= values in its body]}``."""
    found = {}
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            values = [
                kw.value.value for call in ast.walk(node)
                if isinstance(call, ast.Call) for kw in call.keywords
                if kw.arg == 'timeout' and isinstance(kw.value, ast.Constant)
                and isinstance(kw.value.value, (int, float))
            ]
            if values:
                found[node.name] = values
    return found


def test_inner_timeouts_sum_below_the_global_one():
    limit = global_timeout() - MARGIN_S
    too_long = []
    for path in glob.glob(osp.join(REPO_ROOT, 'tests', '**', '*.py'),
                          recursive=True):
        with open(path) as f:
            source = f.read()
        for name, values in timeouts_per_function(source, path).items():
            if sum(values) > limit:
                too_long.append(f'{osp.relpath(path, REPO_ROOT)}::{name} '
                                f'{values}')
    assert global_timeout() == 300
    assert too_long == [], f'inner timeouts above {limit:.0f}s'


def test_the_scan_sees_sequential_timeouts():
    source = ('def test_a():\n    run(timeout=150)\n    run(timeout=150)\n'
              'def helper():\n    t.join(timeout=5)\n')
    assert timeouts_per_function(source) == {
        'test_a': [150, 150], 'helper': [5]}


def short_limits(limits, seconds, factor=LIMIT_FACTOR):
    """``node id (limit, recorded seconds)`` of the tests whose limit is
    below ``factor`` times their recorded time (tests not collected now,
    or not recorded, are not judged)."""
    return [
        f'{nodeid} (limit {limits[nodeid]:.0f} s, took {took:.0f} s)'
        for nodeid, took in sorted(seconds.items())
        if nodeid in limits and limits[nodeid] < factor * took
    ]


def test_every_limit_is_three_times_the_measured_time(request):
    limits = request.config.stash[TEST_LIMITS]
    seconds = load_test_durations()
    assert seconds, 'tests/file_durations.json has no per-test times'
    assert min(seconds.values()) >= RECORDED_TEST_S
    # the tests collected in this run are judged (all of them in CI)
    assert short_limits(limits, seconds) == [], (
        f'raise these limits to {LIMIT_FACTOR}x the recorded time')


def test_the_limit_check_finds_a_short_limit():
    limits = {'a.py::t': 300.0, 'a.py::u': 300.0, 'b.py::v': 60.0}
    seconds = {'a.py::t': 90.0, 'a.py::u': 101.0, 'gone.py::w': 500.0}
    assert short_limits(limits, seconds) == [
        'a.py::u (limit 300 s, took 101 s)'
    ]
