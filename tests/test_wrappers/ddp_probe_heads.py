"""DINOHead variants with the parameter-usage patterns AutoDDP must handle.

Importing this module registers them in mmdet's MODELS.
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS


@MODELS.register_module()
class DINOHeadWithUnusedParam(DINOHead):
    """An extended head whose new parameter never reaches the loss
    (mmdetection #11899)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unused_scale = nn.Parameter(torch.ones(1))


@MODELS.register_module()
class DINOHeadRankZeroBranch(DINOHead):
    """A branch that contributes to the loss on rank 0 only."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rank0_branch = nn.Linear(self.embed_dims, 1)

    def loss(self, hidden_states, *args, **kwargs):
        losses = super().loss(hidden_states, *args, **kwargs)
        if dist.get_rank() == 0:
            extra = self.rank0_branch(hidden_states[-1]).abs().mean()
            losses['loss_cls'] = losses['loss_cls'] + 1e-3 * extra
        return losses


@MODELS.register_module()
class DINOHeadGoesUnusedLater(DINOHead):
    """A branch used by every rank in the first two steps, then no longer on
    the last rank."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.late_branch = nn.Linear(self.embed_dims, 1)
        self.calls = 0

    def loss(self, hidden_states, *args, **kwargs):
        losses = super().loss(hidden_states, *args, **kwargs)
        self.calls += 1
        last_rank = dist.get_rank() == dist.get_world_size() - 1
        if self.calls <= 2 or not last_rank:
            extra = self.late_branch(hidden_states[-1]).abs().mean()
            losses['loss_cls'] = losses['loss_cls'] + 1e-3 * extra
        return losses
