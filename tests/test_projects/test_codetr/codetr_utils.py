"""Tiny CO-DINO models shared by the CO-DETR tests."""
import importlib
import os.path as osp

from ...helpers import REPO_ROOT

TINY_CONFIG = osp.join(REPO_ROOT, 'configs', 'co_dino_tiny.py')
EXT_CONFIG = osp.join(REPO_ROOT, 'configs', 'co_dino_ext.py')
KEYS_FILE = osp.join(
    osp.dirname(osp.abspath(__file__)), 'co_dino_5scale_r50_keys.txt')
# Far below half an ulp of any box coordinate: dn queries equal their GT.
NO_NOISE = 1e-20


def import_project():
    """Register mmddp_ext's and the CO-DETR project's components."""
    from mmdet.utils import register_all_modules

    import mmddp_ext  # noqa: F401
    register_all_modules()
    return importlib.import_module('projects.CO-DETR.codetr')


def tiny_model_cfg(deterministic: bool = False):
    """The tiny CO-DINO model (configs/_base_/models/co_dino_tiny.py).

    Args:
        deterministic (bool): Make each image's loss independent of the
            rest of its batch and of the random state, so that DDP can be
            compared with one process: BN on running statistics, noise-free
            dn queries, the ATSS auxiliary branch with zero-weight, masked
            padding of its query groups, and no RPN/RoI branch (mmdet's
            RPNHead and StandardRoIHead draw random samples and normalise
            their losses per rank, not over all ranks).
    """
    from mmengine.config import Config
    cfg = Config.fromfile(TINY_CONFIG).model
    if deterministic:
        cfg.backbone.norm_eval = True
        cfg.query_head.dn_cfg.label_noise_scale = NO_NOISE
        cfg.query_head.dn_cfg.box_noise_scale = NO_NOISE
        cfg.query_head.use_zero_padding = True
        cfg.query_head.transformer.num_co_heads = 1
        cfg.rpn_head = None
        cfg.roi_head = []
        cfg.train_cfg = [cfg.train_cfg[0], cfg.train_cfg[2]]
        cfg.test_cfg = [cfg.test_cfg[0], cfg.test_cfg[2]]
    return cfg


def build_tiny(cfg, seed: int = 0):
    """Build and initialise ``cfg`` from a fixed seed, in train mode."""
    import torch
    import_project()
    from mmdet.registry import MODELS
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return model.train()
