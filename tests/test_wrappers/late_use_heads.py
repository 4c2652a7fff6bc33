"""Heads and a wrapper for the "left out of DDP, used later" case.

Importing this module registers them (heads in mmdet's MODELS, the wrapper
in MMEngine's MODEL_WRAPPERS).
"""
import torch.nn as nn
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS
from mmengine.model import MMDistributedDataParallel
from mmengine.registry import MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

LATE_BRANCH = 'bbox_head.late_branch'


@MODELS.register_module()
class DINOHeadUsedFromStep2(DINOHead):
    """A branch no rank uses in the first step (so AutoDDP leaves it out of
    DDP) and every rank uses from the second step on, with rank-dependent
    data and so rank-dependent gradients."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.late_branch = nn.Linear(self.embed_dims, 1)
        self.calls = 0

    def loss(self, hidden_states, *args, **kwargs):
        losses = super().loss(hidden_states, *args, **kwargs)
        self.calls += 1
        if self.calls >= 2:
            extra = self.late_branch(hidden_states[-1]).abs().mean()
            losses['loss_cls'] = losses['loss_cls'] + 1e-3 * extra
        return losses


@MODEL_WRAPPERS.register_module()
class DDPIgnoringLateBranch(MMDistributedDataParallel):
    """Stock DDP with ``late_branch`` left out, as AutoDDP leaves it out, but
    without AutoDDP's on-the-spot averaging: the negative control."""

    def __init__(self, module, **kwargs):
        names = [f'{LATE_BRANCH}.weight', f'{LATE_BRANCH}.bias']
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
            module, names)
        super().__init__(module, **kwargs)
