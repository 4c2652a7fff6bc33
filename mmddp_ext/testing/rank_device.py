"""Where a test's tensors and modules live on a rank of
:func:`~mmddp_ext.testing.run_on_ranks` (the CPU, or a GPU under
``MMDDP_EXT_RANK_DEVICE=cuda``, which ``pytest --device cuda`` sets)."""
import torch

from ..launch.rank_launcher import like_a_rank

__all__ = ['like_a_rank', 'on_rank_device', 'rank_test_device']


def rank_test_device() -> torch.device:
    """The device this process creates new tensors on: the rank's GPU in a
    rank started with ``MMDDP_EXT_RANK_DEVICE=cuda`` (torch's default
    device there), the CPU anywhere else."""
    return torch.empty(0).device


def on_rank_device(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` moved to :func:`rank_test_device`; call it once, after its
    last parameter and buffer exist.

    A module built under a CUDA default device is not all on the GPU:
    layers that make a parameter with the legacy ``torch.Tensor(...)``
    constructor (mmdet's ``DeformableDETR.level_embed``), and anything
    loaded or unpickled, stay on the CPU, and
    ``DistributedDataParallel`` refuses the mix ("input module parameters
    locate in {'cuda', 'cpu'}"). A part added after the move stays where
    it was made, so the move comes last.
    """
    return module.to(rank_test_device())
