"""DDP-style gradient averaging and the rank-0 broadcast (AutoDDP's probe
step and the DDP doctor's probe), on real gloo ranks."""
import torch
import torch.distributed as dist
import torch.nn as nn

from mmddp_ext.testing import run_on_ranks


def _average():
    from mmddp_ext.utils.ddp_averaging import (average_gradients,
                                               broadcast_from_rank0,
                                               ranks_with_gradient)
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = nn.Linear(2, 1)
    broadcast_from_rank0(model)
    weight = model.weight.detach().clone()
    model.weight.grad = torch.full_like(model.weight, 2.0 * (rank + 1))
    if rank == 0:  # the bias has a gradient on rank 0 only
        model.bias.grad = torch.full_like(model.bias, 4.0)
    params = list(model.parameters())
    counts = ranks_with_gradient(params)
    average_gradients(params)
    return dict(weight=weight, counts=counts,
                grads=[p.grad.clone() for p in params])


def test_missing_gradients_count_as_zeros_and_rank0_weights_win():
    first, second = run_on_ranks(_average, 2, timeout=60)
    assert torch.equal(first['weight'], second['weight'])
    assert first['counts'] == second['counts'] == [2, 1]
    for result in (first, second):
        torch.testing.assert_close(result['grads'][0],
                                   torch.full((1, 2), 3.0))  # (2 + 4) / 2
        torch.testing.assert_close(result['grads'][1],
                                   torch.full((1, ), 2.0))  # (4 + 0) / 2
