"""Models whose ranks diverge, for RankConsistencyHook's tests.

Importing this module registers the DINOHead variants in mmdet's MODELS.
"""
from typing import Dict, Optional, Sequence

import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.model import BaseModel
from mmengine.structures import InstanceData


@MODELS.register_module()
class DINOHeadExtraKeyOnRank1(DINOHead):
    """Rank 1 adds an auxiliary loss ``loss_aux`` from a branch of its own,
    as a head does that computes an extra term only when its batch allows
    (rank 0 never uses the branch)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.aux_branch = nn.Linear(self.embed_dims, 1)

    def loss(self, hidden_states, *args, **kwargs):
        losses = super().loss(hidden_states, *args, **kwargs)
        if dist.get_rank() == 1:
            aux = self.aux_branch(hidden_states[-1]).abs().mean()
            losses['loss_aux'] = 1e-3 * aux
        return losses


@MODELS.register_module()
class DINOHeadNaNOnRank(DINOHead):
    """``loss_bbox`` and ``d0.loss_bbox`` become NaN on one rank at chosen
    forward calls; the graph stays connected, so the NaN reaches every
    gradient through DDP's all-reduce.

    Args:
        nan_rank (int): The rank whose loss turns NaN. Defaults to 0.
        nan_calls (Sequence[int]): 1-based numbers of the training forward
            calls on that rank whose loss is NaN. Defaults to (2, ).
    """

    def __init__(self,
                 *args,
                 nan_rank: int = 0,
                 nan_calls: Sequence[int] = (2, ),
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.nan_rank = nan_rank
        self.nan_calls = tuple(nan_calls)
        self.calls = 0

    def loss(self, hidden_states, *args, **kwargs):
        losses = super().loss(hidden_states, *args, **kwargs)
        self.calls += 1
        if (dist.get_rank() == self.nan_rank and self.calls in self.nan_calls):
            for key in ('loss_bbox', 'd0.loss_bbox'):
                losses[key] = losses[key] * torch.tensor(float('nan'))
        return losses


class TinyDivergingModel(BaseModel):
    """A linear model whose loss dict each rank shapes by ``scenario``.

    Scenarios: ``'same'`` (every rank alike), ``'missing_on_last'`` (the
    last rank has no ``loss_extra``), ``'extra_collective_on_1'`` (rank 1
    launches one more all-reduce without waiting for it, as a rank does
    with NCCL, whose host does not block), ``'nan_on_<r>'`` (rank r's
    ``loss_extra`` is NaN). Works without a process group too (rank 0 of
    1).
    """

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.scenario = 'same'

    def forward(self, inputs, data_samples=None, mode='loss'):
        rank, world_size = 0, 1
        if dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        out = self.linear(inputs)
        losses: Dict[str, torch.Tensor] = dict(loss_main=out.pow(2).mean())
        if not (self.scenario == 'missing_on_last' and rank == world_size - 1):
            losses['loss_extra'] = out.abs().mean()
        if self.scenario == 'extra_collective_on_1' and rank == 1:
            dist.all_reduce(torch.ones(1), async_op=True)
        if self.scenario == f'nan_on_{rank}':
            losses['loss_extra'] = losses['loss_extra'] * float('nan')
        return losses


def tiny_batch(num_gt: Optional[int], batch_size: int = 2) -> dict:
    """A batch for :class:`TinyDivergingModel` whose first sample has
    ``num_gt`` GT boxes (``None``: no GT annotations at all)."""
    samples = []
    for index in range(batch_size):
        sample = DetDataSample()
        if num_gt is not None:
            count = num_gt if index == 0 else 0
            sample.gt_instances = InstanceData(
                labels=torch.zeros(count, dtype=torch.long),
                bboxes=torch.zeros(count, 4))
        samples.append(sample)
    return dict(inputs=torch.ones(batch_size, 4), data_samples=samples)
