"""DINO heads with the DDP faults the doctor must find.

Importing this module registers them in mmdet's MODELS (the doctor's
probe ranks import it through the test config's ``custom_imports``).
"""
import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS


@MODELS.register_module()
class UnusedParamDropDnHead(DINOHead):
    """A head extended with a parameter that never reaches the loss, and
    that drops its denoising losses when its batch has no GT box (what
    RT-DETR v1 does)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unused_gate = nn.Parameter(torch.ones(1))

    def loss_by_feat(self, *args, **kwargs):
        losses = super().loss_by_feat(*args, **kwargs)
        gt = kwargs.get('batch_gt_instances', args[4] if len(args) > 4
                        else None)
        if sum(len(g) for g in gt) == 0:
            losses = {k: v for k, v in losses.items() if 'dn_' not in k}
        return losses


@MODELS.register_module()
class RankOnlyLossHead(DINOHead):
    """Adds a loss term on the last rank only."""

    def loss_by_feat(self, all_layers_cls_scores, *args, **kwargs):
        losses = super().loss_by_feat(all_layers_cls_scores, *args, **kwargs)
        if dist.get_rank() == dist.get_world_size() - 1:
            losses['loss_rank_only'] = (
                1e-3 * all_layers_cls_scores[-1].abs().mean())
        return losses
