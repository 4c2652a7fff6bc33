import pytest
import torch
import torch.distributed as dist

from mmddp_ext.launch import process_group as dist_env
from mmddp_ext.testing import run_on_ranks


@pytest.mark.parametrize('gpus, ranks, requested, expected, why', [
    (0, 2, None, 'gloo', 'CUDA is not available'),
    (0, 2, 'nccl', 'gloo', 'CUDA is not available'),
    (1, 2, 'nccl', 'gloo', '1 GPU(s) for 2 local ranks'),
    (2, 2, 'nccl', 'nccl', '2 GPU(s) for 2 local ranks'),
    (8, 8, None, 'nccl', '8 GPU(s) for 8 local ranks'),
    (8, 8, 'gloo', 'gloo', "backend 'gloo' requested in dist_cfg"),
])
def test_choose_backend(monkeypatch, gpus, ranks, requested, expected, why):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: gpus)
    monkeypatch.setenv('LOCAL_WORLD_SIZE', str(ranks))
    assert dist_env.choose_backend(requested) == (expected, why)


def test_rank_device_on_cpu(monkeypatch):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 0)
    assert dist_env.rank_device() == torch.device('cpu')


def test_rank_device_shares_gpus_round_robin(monkeypatch):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 2)
    monkeypatch.setenv('LOCAL_RANK', '3')
    assert dist_env.rank_device() == torch.device('cuda', 1)


def test_unknown_launcher_is_refused():
    with pytest.raises(ValueError, match="launcher must be one of"):
        dist_env.init_distributed('torchrun')


def test_missing_torchrun_env_is_refused(monkeypatch):
    for key in dist_env.TORCHRUN_ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match='MASTER_ADDR.*dist_train.sh'):
        dist_env.init_distributed('pytorch')


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
