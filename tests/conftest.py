import os
import os.path as osp
import sys

import pytest

_LAUNCHES_BEFORE = pytest.StashKey[int]()
# node id -> the pytest-timeout limit of each collected test (its own
# ``timeout`` marker, else setup.cfg's), read by test_timeouts.py
TEST_LIMITS = pytest.StashKey[dict]()

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

# the slurm_cluster fixture (a one-node test Slurm)
pytest_plugins = ['tests.slurm_cluster']

# Ranks share 2 cores; one compute thread each keeps runs predictable.
os.environ.setdefault('OMP_NUM_THREADS', '1')
# The learning tests run one process with 2 OpenMP threads beside the other
# pytest worker's ranks; spinning OpenMP threads then take cores from the
# ranks and from each other (measured: 123 s spinning, 95 s passive for the
# RT-DETR learning test beside a 2-rank training). Set before torch loads.
os.environ.setdefault('OMP_WAIT_POLICY', 'PASSIVE')


def pytest_addoption(parser):
    parser.addoption(
        '--device',
        choices=('cpu', 'cuda'),
        default='cpu',
        help='device of the ranks that run_on_ranks starts (cuda: the same '
        'tests with CUDA tensors; every test is skipped where CUDA is not '
        'available; -m multi_rank selects the tests that start ranks). '
        'Launches through tools/dist_train.sh use a GPU whenever there is '
        'one.')
    from tests.failure_log import add_failure_log_option
    add_failure_log_option(parser)


def pytest_configure(config):
    # Read by mmddp_ext.launch.rank_launcher in every rank it starts.
    os.environ['MMDDP_EXT_RANK_DEVICE'] = config.getoption('--device')
    from tests.failure_log import register_failure_log
    from tests.multi_rank_marker import MARKER_HELP
    config.addinivalue_line('markers', MARKER_HELP)
    register_failure_log(config)


def pytest_collection_modifyitems(config, items):
    # longest files first (tools/run_tests.sh keeps this order for xdist)
    from tests.file_order import load_durations, order_by_duration
    from tests.multi_rank_marker import mark_multi_rank
    order_by_duration(items, load_durations())
    mark_multi_rank(items)
    default_limit = float(config.getini('timeout') or 0)
    config.stash[TEST_LIMITS] = {
        item.nodeid: float(marker.args[0]) if marker and marker.args else
        default_limit
        for item in items
        for marker in [item.get_closest_marker('timeout')]
    }
    if config.getoption('--device') != 'cuda':
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason='--device cuda: CUDA is not available')
    for item in items:
        item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test that started ranks must carry the ``multi_rank`` marker
    (tests/multi_rank_marker.py sets it; this catches what it missed)."""
    from tests.multi_rank_marker import launches
    item.stash[_LAUNCHES_BEFORE] = launches()
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    result = yield  # a failing test fails as it is; the check adds nothing
    from tests.multi_rank_marker import check_marked, launches
    check_marked(item, launches() - item.stash[_LAUNCHES_BEFORE])
    return result


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test gets the environment the session started with: an
    in-process entry point (tools/train.py's parse_args exports LOCAL_RANK,
    as MMDetection's does) must not change what later tests in the same
    worker see (the doctor then reports a launcher variable)."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _default_scope_restored():
    """Each test leaves MMEngine's default registry scope as it found it:
    the newest ``DefaultScope`` is the current one, so a runner or a
    scoped build in one test would otherwise decide which registry a later
    test in the same worker builds from (``X is not in the mmengine::...
    registry``), depending on the order xdist runs the files in."""
    from mmengine.registry import DefaultScope
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict.clear()
    DefaultScope._instance_dict.update(saved)


@pytest.fixture(scope='session')
def repo_root():
    return REPO_ROOT


@pytest.fixture(scope='session')
def synthetic_root(tmp_path_factory):
    """A ~50%-empty synthetic train/val dataset shared by the session."""
    from mmddp_ext.testing import make_synthetic_coco
    root = str(tmp_path_factory.mktemp('synthetic'))
    make_synthetic_coco(osp.join(root, 'train'), num_images=24, empty=0.5)
    make_synthetic_coco(
        osp.join(root, 'val'), num_images=8, empty=0.25, seed=1)
    return root
