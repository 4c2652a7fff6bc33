"""Every CO-DINO zoo config gives each parameter upstream's lr and weight
decay.

Expected values: ``co_dino_upstream_param_groups.json``, the optimizer
that MMEngine's ``DefaultOptimWrapperConstructor`` (upstream's rule code)
builds for upstream's own model and config (``regen_keys.py``, which
records the upstream source). The port keeps upstream's parameter names,
so the names compare directly.
"""
import copy
import functools
import json
import os.path as osp

import pytest

from ...helpers import REPO_ROOT
from .codetr_utils import import_project
from .regen_keys import (CODINO_CONFIGS, PARAM_GROUPS, UPSTREAM_CONFIGS,
                         load_model_cfg)

# port config -> upstream config: the codino configs carry upstream's
# file names; configs/co_dino_ext.py is upstream's R50 1x; the custom
# ones follow their base's recipe.
R50_1X = 'co_dino_5scale_r50_8xb2_1x_coco.py'
UPSTREAM_OF = {
    osp.join(REPO_ROOT, 'configs', 'co_dino_ext.py'): R50_1X,
    **{
        osp.join(CODINO_CONFIGS, name): name
        for name in UPSTREAM_CONFIGS if name != R50_1X
    },
    osp.join(CODINO_CONFIGS, 'co_dino_5scale_r50_lsj_custom.py'):
    'co_dino_5scale_r50_lsj_8xb2_1x_coco.py',
    osp.join(CODINO_CONFIGS, 'co_dino_5scale_swin_l_custom.py'):
    'co_dino_5scale_swin_l_16xb1_1x_coco.py',
}


@functools.lru_cache(maxsize=1)
def _upstream_param_groups() -> dict:
    """``co_dino_upstream_param_groups.json``, read once per process."""
    with open(PARAM_GROUPS) as f:
        return json.load(f)['configs']


def upstream_values(upstream_config: str) -> dict:
    groups = _upstream_param_groups()[upstream_config]
    return {
        param: (group['lr'], group['weight_decay'])
        for group in groups
        for param in group['params']
    }


@functools.lru_cache(maxsize=None)
def _config_and_meta_model(config: str):
    """``config`` parsed once per process and its model built once on the
    meta device (``regen_keys.build_model``'s model, from the same parse);
    shared by the tests here, which only read the model's parameter
    names and ``requires_grad`` and copy the config before changing it."""
    from mmdet.registry import MODELS

    from mmddp_ext.testing import model_index_read_once, weights_on_meta
    import_project()
    with model_index_read_once():
        cfg = load_model_cfg(config)
    with weights_on_meta():
        model = MODELS.build(copy.deepcopy(cfg.model))
    return cfg, model


def port_values(config: str, **optim_overrides) -> dict:
    from .regen_keys import param_values
    cfg, model = _config_and_meta_model(config)
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.update(optim_overrides)
    return {
        name: tuple(pair)
        for name, pair in param_values(model, optim_cfg).items()
    }


def _id(config):
    return osp.basename(config)


@pytest.mark.parametrize('config', sorted(UPSTREAM_OF), ids=_id)
def test_every_parameter_has_upstreams_lr_and_weight_decay(config):
    theirs = upstream_values(UPSTREAM_OF[config])
    ours = port_values(config)
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))[:10]
    diff = {n: (ours[n], theirs[n]) for n in ours if ours[n] != theirs[n]}
    assert not diff, (len(diff), sorted(diff.items())[:8])


def test_without_the_backbone_key_the_backbone_lr_differs():
    """Negative control: without ``custom_keys`` the backbone trains at
    the full lr, which the comparison catches."""
    config = osp.join(CODINO_CONFIGS, 'co_dino_5scale_r50_lsj_8xb2_1x_coco.py')
    ours = port_values(config, paramwise_cfg=None)
    theirs = upstream_values(UPSTREAM_OF[config])
    diff = {n for n in ours if ours[n] != theirs[n]}
    assert diff == {n for n in theirs if n.startswith('backbone.')}
    assert len(diff) == 42
