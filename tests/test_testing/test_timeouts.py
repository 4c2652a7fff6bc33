"""Inner timeouts detect hangs before pytest's global timeout does, so a
hang fails with every rank's log and its processes are cleaned up by
``run_on_ranks``/``run_command`` rather than by pytest."""
import ast
import configparser
import glob
import os.path as osp

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
# Spawning ranks and reporting take a few seconds beyond the timeout.
MARGIN_S = 20


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
