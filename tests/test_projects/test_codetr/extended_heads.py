"""Test-only components for CO-DINO training runs; a config imports this
module with ``custom_imports`` to register them."""
import importlib
import json
import math
import os.path as osp

import torch
import torch.distributed as dist
import torch.nn as nn
from mmdet.registry import MODELS
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

codetr = importlib.import_module('projects.CO-DETR.codetr')


@MODELS.register_module()
class CoDINOHeadWithUnusedParam(codetr.CoDINOHead):
    """An extended query head whose new parameter never reaches the loss
    (the mmdetection #11899 pattern)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unused_scale = nn.Parameter(torch.ones(1))


@HOOKS.register_module()
class LossKeyRecorderHook(Hook):
    """Writes, per rank, each iteration's loss keys and whether all of
    them were finite to ``<work_dir>/loss_keys_rank<r>.json``."""

    def __init__(self):
        self.history = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        losses = {k: v for k, v in (outputs or {}).items() if 'loss' in k}
        self.history.append(
            dict(
                keys=sorted(losses),
                finite=all(math.isfinite(float(v)) for v in losses.values()),
                num_gt=sum(
                    len(s.gt_instances) for s in data_batch['data_samples'])))

    def after_train(self, runner):
        rank = dist.get_rank() if dist.is_initialized() else 0
        path = osp.join(runner.work_dir, f'loss_keys_rank{rank}.json')
        with open(path, 'w') as f:
            json.dump(self.history, f)
