"""Tiny CO-DINO models shared by the CO-DETR tests."""
import importlib
import os.path as osp

from ...helpers import REPO_ROOT

TINY_CONFIG = osp.join(REPO_ROOT, 'configs', 'co_dino_tiny.py')
# Far below half an ulp of any box coordinate: dn queries equal their GT.
NO_NOISE = 1e-20
# A sampler quota above any anchor or proposal count: sample everything.
SAMPLE_ALL = 10**6


def import_project():
    """Register mmddp_ext's and the CO-DETR project's components."""
    from mmdet.utils import register_all_modules

    import mmddp_ext  # noqa: F401
    register_all_modules()
    return importlib.import_module('projects.CO-DETR.codetr')


def tiny_model_cfg(deterministic: bool = False):
    """The tiny CO-DINO model (configs/_base_/models/co_dino_tiny.py).

    Args:
        deterministic (bool): Make each image's loss terms independent of
            the rest of its batch and of the random state, so that DDP can
            be compared with one process: BN on running statistics,
            noise-free dn queries, zero-weight masked padding of the
            auxiliary query groups, and RPN/RoI samplers that keep every
            assigned anchor/proposal (a ``RandomSampler`` whose quota
            exceeds any count never draws; ``PseudoSampler`` would divide
            by the positive count, 0 on the GT-less rank) with no GT boxes
            added as proposals (they would change the per-image RoI count
            that bounds the RoI positive group by the rest of the batch).
            The RPN/RoI losses stay normalised per rank as in mmdet; see
            ``test_codetr_dist.py`` for how the reference reproduces that.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(TINY_CONFIG).model
    if deterministic:
        cfg.backbone.norm_eval = True
        cfg.query_head.dn_cfg.label_noise_scale = NO_NOISE
        cfg.query_head.dn_cfg.box_noise_scale = NO_NOISE
        cfg.query_head.use_zero_padding = True
        two_stage = cfg.train_cfg[1]
        for part in (two_stage.rpn, two_stage.rcnn):
            part.sampler.num = SAMPLE_ALL
            part.sampler.add_gt_as_proposals = False
    return cfg


def build_tiny(cfg, seed: int = 0):
    """Build and initialise ``cfg`` from a fixed seed, in train mode, on
    this rank's device (moved once, after its last parameter exists)."""
    import torch
    import_project()
    from mmdet.registry import MODELS

    from mmddp_ext.testing import on_rank_device
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return on_rank_device(model).train()
