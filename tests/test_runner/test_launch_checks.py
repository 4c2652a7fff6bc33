"""Launcher misconfigurations are refused at start-up (issue: fail fast)."""
import os.path as osp
import sys

import pytest
from mmengine.logging import MMLogger

from mmddp_ext.launch.process_group import check_launch_environment
from mmddp_ext.testing import free_port, run_command
from ..helpers import REPO_ROOT, TINY_CONFIG

SPAWNS_INSIDE_TORCHRUN = osp.join(osp.dirname(__file__),
                                  'spawn_inside_torchrun.py')


def _torchrun(*args, nproc=1):
    return [
        sys.executable, '-m', 'torch.distributed.run',
        f'--nproc_per_node={nproc}', f'--master_port={free_port()}', *args
    ]


def test_launcher_none_under_torchrun_is_refused():
    result = run_command(
        _torchrun(osp.join(REPO_ROOT, 'tools', 'train.py'), TINY_CONFIG,
                  nproc=2),
        timeout=90, cwd=REPO_ROOT, check=False)
    assert result.returncode != 0
    assert ('started by a distributed launcher (WORLD_SIZE=2' in
            result.stdout)
    assert 'Pass --launcher pytorch' in result.stdout


def test_spawning_ranks_inside_torchrun_is_refused():
    """The OpenPCDet pattern: a torchrun worker mp.spawns its own ranks."""
    result = run_command(
        _torchrun(SPAWNS_INSIDE_TORCHRUN), timeout=90, cwd=REPO_ROOT,
        check=False)
    assert 'CHILD REFUSED: Two layers of process management' in \
        result.stdout, result.stdout[-3000:]


def test_local_rank_without_process_group_env_is_refused(monkeypatch):
    from mmddp_ext.launch.process_group import init_distributed
    for key in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv('LOCAL_RANK', '0')
    with pytest.raises(ValueError, match='RANK, WORLD_SIZE, MASTER_ADDR'):
        init_distributed('pytorch')


def test_deprecated_launch_is_warned_about(capsys):
    MMLogger.get_instance('mmddp_launch_test')
    check_launch_environment('pytorch', argv=['train.py', '--local-rank=0'])
    assert 'deprecated torch.distributed.launch' in capsys.readouterr().out
    check_launch_environment('pytorch', argv=['train.py'])
    assert 'deprecated' not in capsys.readouterr().out


def test_single_process_is_accepted_and_torchrun_world_is_not(
        monkeypatch, capsys):
    MMLogger.get_instance('mmddp_launch_test')
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    assert check_launch_environment('none', argv=['train.py']) is None
    monkeypatch.setenv('WORLD_SIZE', '1')
    assert check_launch_environment('none', argv=['train.py']) is None
    assert capsys.readouterr().out == ''  # not even a warning
    # The same call inside a torchrun world of 2 is refused.
    monkeypatch.setenv('WORLD_SIZE', '2')
    with pytest.raises(ValueError, match="WORLD_SIZE=2.*launcher='none'"):
        check_launch_environment('none', argv=['train.py'])
