"""Tiny RT-DETR models shared by the RT-DETR tests."""
import importlib
import os.path as osp

from torch.nn.modules.batchnorm import _BatchNorm

from ...test_models.dino_utils import NO_NOISE, build_model

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
TINY_MODEL_CFG = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                          'rtdetr_tiny.py')
TINY_CONFIG = osp.join(REPO_ROOT, 'configs', 'rtdetr_tiny.py')
R18VD_CONFIG = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                        'rtdetr_r18vd_6x_coco.py')


def import_project():
    """Register the RT-DETR components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.RT-DETR.rtdetr')


def tiny_rtdetr_cfg(deterministic: bool = False):
    """configs/_base_/models/rtdetr_tiny.py's model; ``deterministic``
    switches the dn noise off (see dino_utils.NO_NOISE)."""
    from mmengine.config import Config
    cfg = Config.fromfile(TINY_MODEL_CFG).model
    if deterministic:
        cfg.dn_cfg.label_noise_scale = NO_NOISE
        cfg.dn_cfg.box_noise_scale = NO_NOISE
    return cfg


def build_tiny(deterministic: bool = False, seed: int = 0):
    """The tiny RT-DETR in train mode; ``deterministic`` also puts every
    BN layer (backbone, neck, input projection) on its running
    statistics, so no image's loss depends on the rest of its batch."""
    import_project()
    model = build_model(tiny_rtdetr_cfg(deterministic), seed=seed)
    if deterministic:
        for module in model.modules():
            if isinstance(module, _BatchNorm):
                module.eval()
    return model
