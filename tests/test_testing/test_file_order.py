"""The suite's file order: longest files first, from measured times."""
import json
from types import SimpleNamespace

from tests import file_order


def _items(*nodeids):
    return [SimpleNamespace(nodeid=n) for n in nodeids]


def test_longest_files_first_and_each_file_keeps_its_order():
    items = _items('tests/a.py::one', 'tests/b.py::one', 'tests/a.py::two',
                   'tests/c.py::one', 'tests/b.py::two', 'tests/new.py::x')
    file_order.order_by_duration(items, {
        'tests/a.py': 1.0,
        'tests/b.py': 90.0,
        'tests/c.py': 5.0,
    })
    # new.py, unknown, counts as the median file (5 s), after c.py
    assert [i.nodeid for i in items] == [
        'tests/b.py::one', 'tests/b.py::two', 'tests/c.py::one',
        'tests/new.py::x', 'tests/a.py::one', 'tests/a.py::two'
    ]


def test_without_times_the_order_is_left_alone():
    items = _items('tests/b.py::one', 'tests/a.py::one')
    file_order.order_by_duration(items, {})
    assert [i.nodeid for i in items] == ['tests/b.py::one', 'tests/a.py::one']


def test_times_come_from_a_durations_log(tmp_path):
    log = tmp_path / 'suite.log'
    log.write_text('12.50s call     tests/x.py::test_a[1]\n'
                   '2.00s setup    tests/x.py::test_a[1]\n'
                   '0.30s call     tests/y/z.py::TestK::test_b\n'
                   '========= 3 passed in 15.00s =========\n')
    assert file_order.durations_from_log(log.read_text()) == {
        'tests/x.py': 14.5,
        'tests/y/z.py': 0.3
    }


def test_the_stored_times_name_existing_files(repo_root):
    import os.path as osp
    with open(file_order.DURATIONS) as f:
        stored = json.load(f)
    assert stored['source'] and stored['seconds']
    missing = [
        name for name in stored['seconds']
        if not osp.exists(osp.join(repo_root, name))
    ]
    assert not missing, (
        f'{missing} are gone: regenerate tests/file_durations.json '
        '(tests/file_order.py says how)')
