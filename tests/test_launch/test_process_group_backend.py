"""A job whose launcher does not set LOCAL_WORLD_SIZE keeps the NCCL it
asks for (issue 14, case 10): no guess from WORLD_SIZE, which counts the
ranks of every node."""
import pytest

from mmddp_ext.launch import process_group as dist_env


@pytest.mark.parametrize('requested', ['nccl', None])
def test_no_local_world_size_keeps_nccl(monkeypatch, requested):
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 8)
    monkeypatch.delenv('LOCAL_WORLD_SIZE', raising=False)
    monkeypatch.setenv('WORLD_SIZE', '16')  # 2 nodes x 8 GPUs
    backend, reason = dist_env.choose_backend(requested)
    assert backend == 'nccl'
    assert 'LOCAL_WORLD_SIZE is not set' in reason


def test_the_old_guess_would_have_switched_to_gloo(monkeypatch):
    """Negative control: 16 local ranks on 8 GPUs is what the old code
    read from WORLD_SIZE; that count does mean gloo."""
    monkeypatch.setattr(dist_env, 'visible_gpu_count', lambda: 8)
    monkeypatch.setenv('LOCAL_WORLD_SIZE', '16')
    assert dist_env.choose_backend('nccl')[0] == 'gloo'


def test_single_process_without_launcher(monkeypatch):
    monkeypatch.delenv('LOCAL_WORLD_SIZE', raising=False)
    monkeypatch.delenv('WORLD_SIZE', raising=False)
    assert dist_env.local_world_size() == 1
