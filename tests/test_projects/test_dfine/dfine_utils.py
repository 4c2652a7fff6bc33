"""Configs and builders shared by the D-FINE tests."""
import importlib
import os.path as osp

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PROJECT = osp.join(REPO_ROOT, 'projects', 'D-FINE')
TINY_CONFIG = osp.join(PROJECT, 'configs', 'dfine_hgnetv2_tiny_synthetic.py')
SIZES = ('n', 's', 'm', 'l', 'x')
# Every loss term upstream D-FINE computes for a 3-layer decoder (the tiny
# config's): the last layer, two earlier ones, layer 0's box, the encoder,
# and the denoising copies.
EXPECTED_KEYS = {
    f'loss_{term}{suffix}'
    for suffix in ('', '_aux_0', '_aux_1', '_pre', '_enc_0', '_dn_0', '_dn_1',
                   '_dn_2', '_dn_pre')
    for term in ('vfl', 'bbox', 'giou')
} | {
    f'loss_fgl{suffix}'
    for suffix in ('', '_aux_0', '_aux_1', '_dn_0', '_dn_1', '_dn_2')
} | {
    f'loss_ddf{suffix}'
    for suffix in ('_aux_0', '_aux_1', '_dn_0', '_dn_1', '_dn_2')
}


def model_config(size: str) -> str:
    """``configs/_base_/dfine_hgnetv2_{size}.py`` of the project."""
    return osp.join(PROJECT, 'configs', '_base_', f'dfine_hgnetv2_{size}.py')


def import_project():
    """Register the D-FINE components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.D-FINE.dfine')


def tiny_model_cfg(**overrides):
    """The tiny test config's model, ``overrides`` merged into it; the
    mmdet scope set so that ``MODELS.build`` finds every type."""
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    import_project()
    cfg = Config.fromfile(TINY_CONFIG)
    cfg.merge_from_dict({f'model.{k}': v for k, v in overrides.items()})
    return cfg.model


def build_tiny(seed: int = 0, **overrides):
    """The tiny D-FINE in train mode (``overrides`` merged into its model
    config)."""
    from ...test_models.dino_utils import build_model
    return build_model(tiny_model_cfg(**overrides), seed=seed)
