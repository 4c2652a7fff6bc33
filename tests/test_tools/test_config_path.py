"""``package::relative`` config paths (MMDet's installed model zoo, the
spelling ``_base_`` entries use) on the command line of tools/train.py,
tools/test.py, tools/dist_train.sh and tools/ddp_doctor.py."""
import importlib.util
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

from ..helpers import REPO_ROOT

ZOO_DINO = 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'


def _train_script():
    spec = importlib.util.spec_from_file_location(
        'mmddp_ext_train_cli', osp.join(REPO_ROOT, 'tools', 'train.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_package_paths_resolve_to_the_installed_zoo():
    path = _train_script().config_file(ZOO_DINO)
    import mmdet
    assert path == osp.join(
        osp.dirname(mmdet.__file__), '.mim', 'configs', 'dino',
        'dino-4scale_r50_8xb2-12e_coco.py')
    assert Config.fromfile(path).model.type == 'DINO'
    # What the tools did before: MMEngine reads the spelling in _base_
    # only, and a command line path is a file name.
    with pytest.raises(FileNotFoundError):
        Config.fromfile(ZOO_DINO)


@pytest.mark.parametrize('path, message', [
    ('mmdet::dino/no-such-config.py', "no config 'dino/no-such-config.py'"),
    ('no_such_package::a/b.py', "the package 'no_such_package', which is "
     'not installed'),
    ('no/such/file.py', 'does not exist'),
])
def test_bad_paths_name_the_problem(path, message):
    with pytest.raises(SystemExit, match=message):
        _train_script().config_file(path, 'train.py')


def test_launcher_checks_a_package_path_before_starting_ranks():
    result = subprocess.run(
        ['bash', 'tools/dist_train.sh', 'mmdet::dino/no-such-config.py', '2'],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "dist_train.sh: 'mmdet::dino/no-such-config.py': no config" in (
        result.stderr)
    assert 'torch.distributed' not in result.stderr  # no rank started


def test_the_doctor_reads_a_package_path():
    """Static checks only: the report is made for the zoo config (its COCO
    files are not here, which the dataset check reports)."""
    result = subprocess.run(
        [sys.executable, 'tools/ddp_doctor.py', ZOO_DINO, '--no-dynamic'],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode in (0, 1), output[-3000:]
    assert 'does not exist' not in output.split('annotation')[0]
    assert 'dino-4scale_r50_8xb2-12e_coco.py' in output
    assert 'verdict:' in output
