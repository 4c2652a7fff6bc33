"""Paths and builders shared by the DEIMv2 tests."""
import functools
import glob
import importlib
import os.path as osp

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PROJECT = osp.join(REPO_ROOT, 'projects', 'DEIMv2')
DATA = osp.join(osp.dirname(osp.abspath(__file__)), 'data')
# The 12 COCO configs of upstream's configs/deimv2/.
SIZES = ('hgnetv2_atto', 'hgnetv2_femto', 'hgnetv2_pico', 'hgnetv2_n',
         'hgnetv2_s', 'hgnetv2_m', 'hgnetv2_l', 'hgnetv2_x', 'dinov3_s',
         'dinov3_m', 'dinov3_l', 'dinov3_x')
DINOV3_SIZES = tuple(s for s in SIZES if s.startswith('dinov3'))


def import_project():
    """Register the DEIMv2 components (and the ports it builds on)."""
    return importlib.import_module('projects.DEIMv2.deimv2')


def coco_config(size: str) -> str:
    return osp.join(PROJECT, 'configs', f'deimv2_{size}_coco.py')


def all_configs() -> list:
    """Every shipped config (not the _base_ fragments)."""
    return sorted(glob.glob(osp.join(PROJECT, 'configs', '*.py')))


def model_cfg(config: str, **overrides):
    """The model of ``config`` with ``overrides`` merged in, the mmdet
    scope set so that ``MODELS.build`` finds every type."""
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    import_project()
    cfg = Config.fromfile(config)
    cfg.merge_from_dict({f'model.{k}': v for k, v in overrides.items()})
    return cfg.model


@functools.lru_cache(maxsize=None)
def coco_meta_model(size: str):
    """``(cfg, model)`` of the size's COCO config, the model built on the
    meta device (shapes only), once per process: the converter and recipe
    tests only read them."""
    import copy

    import torch
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    from mmddp_ext.testing import model_index_read_once
    register_all_modules()
    import_project()
    with model_index_read_once():
        cfg = Config.fromfile(coco_config(size))
    with torch.device('meta'):
        model = MODELS.build(copy.deepcopy(cfg.model))
    return cfg, model
