import socket

import pytest
import torch
import torch.distributed as dist

from mmddp_ext.launch import process_group as dist_env
from mmddp_ext.testing import run_on_ranks


def test_rank_device_on_cpu(monkeypatch):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 0)
    assert dist_env.rank_device() == torch.device('cpu')


def test_rank_device_shares_gpus_round_robin(monkeypatch):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 2)
    monkeypatch.setenv('LOCAL_RANK', '3')
    assert dist_env.rank_device() == torch.device('cuda', 1)


@pytest.mark.parametrize(
    'visible, local, count, expected',
    [
        ('5', 3, 1,
         '5'),  # a Slurm task shown only its card: --gpus-per-task=1
        (None, 3, 2, '1'),  # 4 local ranks sharing 2 GPUs round robin
    ])
def test_mmengine_finds_the_card_of_a_rank(monkeypatch, visible, local, count,
                                           expected):
    """MMEngine's logger reads ``CUDA_VISIBLE_DEVICES[LOCAL_RANK]`` each
    time it creates a logger; past the list's end it raised IndexError
    (the negative control, before the fix), on every rank but the first."""
    from mmengine.logging.logger import _get_device_id
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: count)
    monkeypatch.setenv('LOCAL_RANK', str(local))
    if visible is None:
        monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    else:
        monkeypatch.setenv('CUDA_VISIBLE_DEVICES', visible)
    with pytest.raises(IndexError):
        _get_device_id()
    dist_env.index_cards_by_local_rank(local, count)
    assert str(_get_device_id()) == expected
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: count)
    assert dist_env.rank_device().index == local % count


def test_a_long_enough_card_list_is_left_alone(monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '4,5,6,7')
    dist_env.index_cards_by_local_rank(3, 4)
    assert dist_env.os.environ['CUDA_VISIBLE_DEVICES'] == '4,5,6,7'


def test_unknown_launcher_is_refused():
    with pytest.raises(ValueError, match="launcher must be one of"):
        dist_env.init_distributed('torchrun')


def test_missing_torchrun_env_is_refused(monkeypatch):
    for key in dist_env.TORCHRUN_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match='MASTER_ADDR.*dist_train.sh'):
        dist_env.init_distributed('pytorch')


def test_a_port_another_process_holds_is_named_with_the_fix(monkeypatch):
    """The control: torch's own error names the port but not what to do
    about it."""
    with socket.socket() as holder:
        holder.bind(('127.0.0.1', 0))
        holder.listen()
        port = holder.getsockname()[1]
        monkeypatch.setenv('RANK', '0')
        monkeypatch.setenv('WORLD_SIZE', '1')
        monkeypatch.setenv('MASTER_ADDR', '127.0.0.1')
        monkeypatch.setenv('MASTER_PORT', str(port))
        with pytest.raises(RuntimeError,
                           match=f'port {port} of 127.0.0.1: another '
                           'process .* holds it. Choose another port: '
                           'env_cfg.dist_cfg.port') as raised:
            dist_env.init_distributed('pytorch', timeout=10)
    cause = str(raised.value.__cause__)
    assert 'EADDRINUSE' in cause and 'dist_cfg' not in cause
    assert not dist.is_initialized()


def _init_and_all_reduce():
    backend = dist_env.init_distributed('pytorch', backend='nccl', timeout=60)
    # on the rank's GPU where NCCL was chosen (it takes no CPU tensors)
    value = torch.tensor([float(dist.get_rank() + 1)],
                         device=dist_env.rank_device())
    dist.all_reduce(value)
    return backend, dist.get_world_size(), value.item()


@pytest.mark.parametrize('world_size', [2, 3])
def test_init_distributed_falls_back_to_gloo_on_cpu(world_size):
    """The stock MMEngine path (nccl requested, torch.cuda.set_device)
    cannot run here; ours must, on real ranks."""
    results = run_on_ranks(
        _init_and_all_reduce, world_size, timeout=60, init_group=False)
    expected_sum = world_size * (world_size + 1) / 2
    # A node with a GPU for every rank keeps NCCL (the same rule, seen
    # from the other side; the ranks share this machine's GPUs).
    expected = 'nccl' if torch.cuda.device_count() >= world_size else 'gloo'
    assert results == [(expected, world_size, expected_sum)] * world_size
