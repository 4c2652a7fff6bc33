"""The ``multi_rank`` marker (tests/multi_rank_marker.py): which code counts
as starting ranks, the run-time check behind it, and that this file's own
tests are marked as they should be (pytest's collection of this file)."""
from types import SimpleNamespace

import pytest

from mmddp_ext.testing import on_rank_device, run_on_ranks
from tests.multi_rank_marker import MARKER, _Reach, check_marked


def _launches_directly():
    return run_on_ranks(print, 2)


def _through_a_helper():
    return _launches_directly()


def _imports_inside():
    from mmddp_ext.launch.rank_launcher import run_command
    return run_command(['true'])


def _through_a_helper_module():
    from ..helpers import dist_train
    return dist_train


def _never_launches():
    return on_rank_device(SimpleNamespace())


class _Launcher:

    def go(self):
        return _through_a_helper()


def _through_a_class():
    return _Launcher().go()


@pytest.mark.parametrize('function', [
    _launches_directly, _through_a_helper, _imports_inside,
    _through_a_helper_module, _through_a_class
])
def test_code_that_reaches_a_launcher_is_found(function):
    assert _Reach()(function)


def test_code_that_starts_no_ranks_is_not_marked():
    """Negative control: mmddp_ext.testing imported, no launcher used."""
    assert not _Reach()(_never_launches)


def _item(marked: bool):
    markers = {MARKER: object()} if marked else {}
    return SimpleNamespace(nodeid='t.py::test_x',
                           get_closest_marker=markers.get)


def test_a_launch_without_the_marker_fails_the_test():
    with pytest.raises(pytest.fail.Exception, match='not marked multi_rank'):
        check_marked(_item(marked=False), launched=1)
    check_marked(_item(marked=True), launched=1)
    check_marked(_item(marked=False), launched=0)


def test_this_files_tests_carry_the_marker_as_they_should(request):
    """The collection marked none of these tests (none starts ranks)."""
    own = [
        item for item in request.session.items
        if item.fspath == request.node.fspath
    ]
    assert own and not any(item.get_closest_marker(MARKER) for item in own)
