import os
import time

import pytest
import torch
import torch.distributed as dist

from mmddp_ext.testing import MultiRankError, run_command, run_on_ranks


def _rank_and_sum():
    value = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(value)
    return dist.get_rank(), int(os.environ['LOCAL_RANK']), value.item()


def _rank1_skips_collective():
    print(f'rank {dist.get_rank()} about to all_reduce', flush=True)
    if dist.get_rank() == 0:
        dist.all_reduce(torch.ones(1))  # rank 1 never joins: a hang
    else:
        time.sleep(600)


def _rank1_raises():
    if dist.get_rank() == 1:
        raise KeyError('boom on rank 1')
    return 'fine'


@pytest.mark.parametrize('world_size', [2, 3])
def test_run_on_ranks_returns_per_rank_results(world_size):
    results = run_on_ranks(_rank_and_sum, world_size, timeout=60)
    total = world_size * (world_size + 1) / 2
    assert results == [(r, r, total) for r in range(world_size)]


def test_hang_fails_fast_with_every_rank_log():
    start = time.monotonic()
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(_rank1_skips_collective, 2, timeout=15)
    assert time.monotonic() - start < 40
    message = str(info.value)
    assert 'timed out' in message
    assert 'rank 0 about to all_reduce' in message
    assert 'rank 1 about to all_reduce' in message


def test_rank_error_is_reported_with_its_traceback():
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(_rank1_raises, 2, timeout=60)
    message = str(info.value)
    assert 'rank(s) [1] failed' in message
    assert 'boom on rank 1' in message


def test_run_command_kills_every_descendant_on_timeout(tmp_path):
    """Like torchrun's workers, the sleeper runs in a session of its own,
    out of reach of a process-group kill."""
    pid_file = tmp_path / 'pid'
    start = time.monotonic()
    with pytest.raises(MultiRankError, match='timed out'):
        run_command(['bash', '-c', f'setsid sleep 300 & echo $! > {pid_file};'
                     ' wait'], timeout=3)
    assert time.monotonic() - start < 20
    pid = int(pid_file.read_text())
    time.sleep(0.5)
    assert not os.path.exists(f'/proc/{pid}') or open(
        f'/proc/{pid}/stat').read().split()[2] == 'Z'
