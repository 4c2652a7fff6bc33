"""Longest test files first, so that the two xdist workers finish
together.

xdist's ``--dist loadfile`` hands out whole files, by default in the order
of their test count; here the long files are the few-test ones (2-rank
trainings, fine-tunes), which then come last and leave one worker idle
at the end. With ``--no-loadscope-reorder`` xdist keeps the collection
order, which :func:`order_by_duration` sets from the per-file times of a
measured run (``file_durations.json``, longest first: the classic
longest-processing-time rule). A file missing there counts as the median
file; tests keep their order within a file.

The same file keeps the time of each long test, whose pytest-timeout limit
tests/test_testing/test_timeouts.py compares with it. Regenerate the times
from a run with ``--durations=0``::

    bash tools/run_tests.sh --durations=0 > /tmp/suite.log
    python tests/file_order.py /tmp/suite.log
"""
import json
import os.path as osp
import re
import statistics
import sys
from typing import Dict, List

DURATIONS = osp.join(osp.dirname(osp.abspath(__file__)),
                     'file_durations.json')
LINE = re.compile(r'^([\d.]+)s (?:call|setup|teardown)\s+([^\s:]+)::')
TEST_LINE = re.compile(r'^([\d.]+)s (?:call|setup|teardown)\s+(\S+::\S+)$')
# Per-test times are kept for the tests at least this long: the ones whose
# limits tests/test_testing/test_timeouts.py compares with them.
RECORDED_TEST_S = 10.0


def load_durations(path: str = DURATIONS) -> Dict[str, float]:
    """Seconds per test file (path from the repository root), or {} when
    there is no file."""
    if not osp.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)['seconds']


def file_of(nodeid: str) -> str:
    return nodeid.split('::', 1)[0]


def order_by_duration(items: List, durations: Dict[str, float]) -> None:
    """Sort ``items`` (pytest items, in place) by their file's duration,
    longest first; stable, so each file keeps its own order."""
    if not durations:
        return
    default = statistics.median(durations.values())
    items.sort(key=lambda item: -durations.get(file_of(item.nodeid), default))


def durations_from_log(text: str, per: str = 'file') -> Dict[str, float]:
    """Sums of the ``--durations=0`` lines of a pytest log, per test file
    (``per='file'``) or per test (``per='test'``: set-up, call and
    tear-down, what pytest-timeout's limit bounds)."""
    pattern = LINE if per == 'file' else TEST_LINE
    seconds: Dict[str, float] = {}
    for line in text.splitlines():
        match = pattern.match(line)
        if match:
            name = match.group(2)
            seconds[name] = seconds.get(name, 0.0) + float(match.group(1))
    return {name: round(value, 1) for name, value in sorted(seconds.items())}


def load_test_durations(path: str = DURATIONS) -> Dict[str, float]:
    """Seconds per test (node id) of the tests that took at least
    :data:`RECORDED_TEST_S` in the measured run, or {}."""
    if not osp.exists(path):
        return {}
    with open(path) as f:
        return json.load(f).get('tests', {})


def main(log: str) -> None:
    with open(log) as f:
        seconds = durations_from_log(f.read())
    if not seconds:
        raise SystemExit(f'{log} has no duration lines: run the suite with '
                         '--durations=0 and pass its output.')
    with open(log) as f:
        tests = {
            name: value
            for name, value in durations_from_log(f.read(), 'test').items()
            if value >= RECORDED_TEST_S
        }
    with open(DURATIONS, 'w') as f:
        json.dump(
            dict(source=osp.basename(log), seconds=seconds, tests=tests),
            f,
            indent=1)
        f.write('\n')
    print(f'{len(seconds)} files, {sum(seconds.values()):.0f} s')


if __name__ == '__main__':
    main(sys.argv[1])
