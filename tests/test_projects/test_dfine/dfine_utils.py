"""Configs and builders shared by the D-FINE tests."""
import importlib
import os.path as osp

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PROJECT = osp.join(REPO_ROOT, 'projects', 'D-FINE')
TINY_CONFIG = osp.join(PROJECT, 'configs', 'dfine_hgnetv2_tiny_synthetic.py')
SIZES = ('n', 's', 'm', 'l', 'x')


def model_config(size: str) -> str:
    """``configs/_base_/dfine_hgnetv2_{size}.py`` of the project."""
    return osp.join(PROJECT, 'configs', '_base_', f'dfine_hgnetv2_{size}.py')


def import_project():
    """Register the D-FINE components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.D-FINE.dfine')


def tiny_model_cfg():
    """The tiny test config's model."""
    from mmengine.config import Config
    return Config.fromfile(TINY_CONFIG).model


def build_tiny(seed: int = 0, **overrides):
    """The tiny D-FINE in train mode (``overrides`` merged into its model
    config)."""
    from ...test_models.dino_utils import build_model
    import_project()
    cfg = tiny_model_cfg()
    cfg.merge_from_dict(overrides)
    return build_model(cfg, seed=seed)
