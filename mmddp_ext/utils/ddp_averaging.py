"""What ``DistributedDataParallel`` does to parameters, done by hand where
DDP does not run: the rank-0 broadcast of its constructor and the gradient
averaging of its reducer.

``AutoDDP`` uses both for its probe step (before it builds DDP) and for
parameters it left out of DDP; the DDP doctor uses them in its probe,
which never builds DDP.
"""
from collections import OrderedDict
from typing import Dict, List, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn

from .torch_private import flatten, unflatten


def broadcast_from_rank0(module: nn.Module) -> None:
    """Give every rank rank 0's parameters and buffers, as
    ``DistributedDataParallel``'s constructor does."""
    with torch.no_grad():
        for tensor in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(tensor.data, src=0)


def average_gradients(params: Sequence[nn.Parameter]) -> None:
    """Average ``params``' gradients across ranks as DDP's reducer does: a
    rank without a gradient for a parameter contributes zeros (its
    ``grad`` becomes a zero tensor first), and each gradient is divided by
    the world size before the sum. One flat all-reduce per dtype."""
    if not params:
        return
    world_size = dist.get_world_size()
    by_dtype: Dict[torch.dtype, List[torch.Tensor]] = OrderedDict()
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
    for grads in by_dtype.values():
        flat = flatten(grads).div_(world_size)
        dist.all_reduce(flat)
        for grad, synced in zip(grads, unflatten(flat, grads)):
            grad.copy_(synced)


def ranks_with_gradient(params: Sequence[nn.Parameter]) -> List[int]:
    """For each parameter, on how many ranks it has a gradient now."""
    if not params:
        return []
    counts = torch.tensor([p.grad is not None for p in params],
                          dtype=torch.int32,
                          device=params[0].device)
    dist.all_reduce(counts)
    return counts.tolist()
