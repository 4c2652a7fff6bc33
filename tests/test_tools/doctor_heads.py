"""DINO heads with the DDP faults the doctor must find.

Importing this module registers them in mmdet's MODELS (the doctor's
probe ranks import it through the test config's ``custom_imports``).
"""
import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.models.dense_heads import (DINOHead, deformable_detr_head,
                                      detr_head, dino_head)
from mmdet.models.detectors import DINO
from mmdet.registry import HOOKS, MODELS
from mmengine.hooks import Hook


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


@contextlib.contextmanager
def _local_counts():
    """mmdet's ``reduce_mean`` made the identity in its DETR-family head
    modules: every count a loss is normalised by stays the local one."""
    modules = [
        m for m in (detr_head, deformable_detr_head, dino_head)
        if hasattr(m, 'reduce_mean')
    ]
    saved = [m.reduce_mean for m in modules]
    for module in modules:
        module.reduce_mean = lambda tensor: tensor
    try:
        yield
    finally:
        for module, original in zip(modules, saved):
            module.reduce_mean = original


@MODELS.register_module()
class LocalCountDINOHead(DINOHead):
    """The classic DDP normalisation bug: losses normalised by the local
    batch's box count instead of the mean over the ranks. Same loss keys,
    graph and collectives on every rank (none: the counts never leave the
    rank)."""

    def loss_by_feat(self, *args, **kwargs):
        with _local_counts():
            return super().loss_by_feat(*args, **kwargs)


@MODELS.register_module()
class NaNOnLastRankHead(DINOHead):
    """``loss_bbox`` is NaN on the last rank in every training forward."""

    def loss_by_feat(self, *args, **kwargs):
        losses = super().loss_by_feat(*args, **kwargs)
        if dist.get_rank() == dist.get_world_size() - 1:
            losses['loss_bbox'] = losses['loss_bbox'] * float('nan')
        return losses


@MODELS.register_module()
class EpochGatedHead(DINOHead):
    """Reads ``self.epoch``, which only the config's
    ``SetHeadEpochHook`` sets (as heads with epoch-dependent losses do);
    without the hook the first forward fails comparing None with an
    int."""

    epoch = None

    def loss_by_feat(self, *args, **kwargs):
        losses = super().loss_by_feat(*args, **kwargs)
        if self.epoch < 0:  # TypeError when no hook set it
            raise AssertionError('unreachable')
        return losses


@HOOKS.register_module()
class SetHeadEpochHook(Hook):
    """Gives the model's head the epoch, before each epoch."""

    def before_train_epoch(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model,
                                               'module') else runner.model
        model.bbox_head.epoch = runner.epoch


@MODELS.register_module()
class SelfSyncBNDINO(DINO):
    """Converts its BatchNorm layers to SyncBatchNorm itself when it is
    built in a process group of more than one rank, as mmdet's RTMDet
    does (``use_syncbn``)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if dist.is_initialized() and dist.get_world_size() > 1:
            nn.SyncBatchNorm.convert_sync_batchnorm(self)
