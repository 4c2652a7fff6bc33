"""Every RT-DETR zoo config gives each parameter upstream's lr and weight
decay.

The expected values are ``data/upstream_recipes.json``: the optimizer
that upstream's own ``YAMLConfig`` builds (``get_optim_params`` on
upstream's model from upstream's YAML), written by
``data/make_upstream_recipes.py`` from a lyuwenyu/RT-DETR checkout
(source and commit inside the file). Upstream's names are mapped to the
port's by tools/convert_rtdetr_checkpoint.py's table, the one the
checkpoints load through; the constructor under test uses its own inverse
map (``rtdetr_upstream_param_names``), so a mistake in either shows.
"""
import functools
import json
import math
import os.path as osp
from typing import Dict, Tuple

import pytest
import torch

from .rtdetr_utils import import_project
from .test_convert_rtdetr_checkpoint import DATA
from .test_rtdetr_zoo import ZOO_CONFIGS, build, model_cfg, zoo_config

UPSTREAM_YML = {
    (1, 'r18vd'): 'rtdetr_pytorch/configs/rtdetr/rtdetr_r18vd_6x_coco.yml',
    (1, 'r34vd'): 'rtdetr_pytorch/configs/rtdetr/rtdetr_r34vd_6x_coco.yml',
    (1, 'r50vd_m'): 'rtdetr_pytorch/configs/rtdetr/rtdetr_r50vd_m_6x_coco.yml',
    (1, 'r50vd'): 'rtdetr_pytorch/configs/rtdetr/rtdetr_r50vd_6x_coco.yml',
    (1, 'r101vd'): 'rtdetr_pytorch/configs/rtdetr/rtdetr_r101vd_6x_coco.yml',
    (2, 'r18vd'):
    'rtdetrv2_pytorch/configs/rtdetrv2/rtdetrv2_r18vd_120e_coco.yml',
    (2, 'r34vd'):
    'rtdetrv2_pytorch/configs/rtdetrv2/rtdetrv2_r34vd_120e_coco.yml',
    (2, 'r50vd_m'):
    'rtdetrv2_pytorch/configs/rtdetrv2/rtdetrv2_r50vd_m_7x_coco.yml',
    (2, 'r50vd'):
    'rtdetrv2_pytorch/configs/rtdetrv2/rtdetrv2_r50vd_6x_coco.yml',
    (2, 'r101vd'):
    'rtdetrv2_pytorch/configs/rtdetrv2/rtdetrv2_r101vd_6x_coco.yml',
}
# The paramwise_cfg of the configs before RegexOptimWrapperConstructor
# (MMEngine's DefaultOptimWrapperConstructor), for the negative control.
MMENGINE_FORM = {
    1:
    dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={'backbone': dict(lr_mult=0.1)}),
    2:
    dict(
        norm_decay_mult=0.0,
        bias_decay_mult=1.0,
        custom_keys={'backbone': dict(lr_mult=1.0)}),
}

Values = Dict[str, Tuple[float, float]]


@functools.lru_cache(maxsize=1)
def _upstream_recipes() -> dict:
    """``data/upstream_recipes.json``, read once per process (read only)."""
    with open(osp.join(DATA, 'upstream_recipes.json')) as f:
        return json.load(f)['configs']


def upstream_recipe(version: int, name: str) -> dict:
    return _upstream_recipes()[UPSTREAM_YML[(version, name)]]


def upstream_values(version: int, name: str) -> Values:
    """Upstream's (lr, weight decay) by the port's parameter name."""
    recipe = upstream_recipe(version, name)
    upstream = {
        param: (group['lr'], group['weight_decay'])
        for group in recipe['param_groups']
        for param in group['params']
    }
    names = list(upstream)
    # the converter maps whole state dicts (the encoder head's index is
    # the decoder's layer count): tag each tensor with its position
    rtdetr = import_project()
    converted = rtdetr.convert_rtdetr_state_dict(
        {
            key: torch.tensor(i)
            for i, key in enumerate(names)
        },
        log=lambda line: None)
    return {port: upstream[names[int(tag)]] for port, tag in converted.items()}


def port_values(config: str, **overrides) -> Values:
    """(lr, weight decay) of each trainable parameter in the optimizer
    that MMEngine builds from ``config``'s ``optim_wrapper`` (``overrides``
    replace its keys, e.g. ``paramwise_cfg``)."""
    from mmengine.optim import build_optim_wrapper
    cfg = zoo_config(config)
    model = meta_model(config)
    optim_cfg = cfg.optim_wrapper.copy()
    # AmpOptimWrapper needs a GPU; the wrapper type does not touch the
    # parameter groups, which the constructor builds.
    optim_cfg.type = 'OptimWrapper'
    optim_cfg.pop('loss_scale', None)
    optim_cfg.update(overrides)
    wrapper = build_optim_wrapper(model, optim_cfg)
    name_of = {id(p): name for name, p in model.named_parameters()}
    return {
        name_of[id(param)]: (group['lr'], group['weight_decay'])
        for group in wrapper.optimizer.param_groups
        for param in group['params'] if param.requires_grad
    }


@functools.lru_cache(maxsize=None)
def meta_model(config: str):
    """``config``'s model on the meta device, built once per process and
    shared by the tests here, which only read its parameters' names and
    ``requires_grad`` (the optimizer constructor changes neither)."""
    import_project()
    return build(model_cfg(config), meta=True)


def differences(ours: Values, theirs: Values) -> Dict[str, tuple]:
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))[:10]
    return {
        name: (ours[name], theirs[name])
        for name in ours if not all(
            math.isclose(a, b, rel_tol=1e-9, abs_tol=0)
            for a, b in zip(ours[name], theirs[name]))
    }


@pytest.mark.parametrize('version,name', sorted(ZOO_CONFIGS))
def test_every_parameter_has_upstreams_lr_and_weight_decay(version, name):
    ours = port_values(ZOO_CONFIGS[(version, name)])
    theirs = upstream_values(version, name)
    assert len(theirs) > 300
    diff = differences(ours, theirs)
    assert not diff, (len(diff), sorted(diff.items())[:8])


@pytest.mark.parametrize('version,name,count', [(1, 'r18vd', 54),
                                                (1, 'r50vd', 11),
                                                (2, 'r18vd', 46)])
def test_mmengine_paramwise_form_differs_from_upstream(version, name, count):
    """Negative control: the configs' former MMEngine form
    (``custom_keys`` + decay multipliers) gives other values, the way the
    issue found them: trainable backbone BN layers keep weight decay once
    ``custom_keys`` matched them (r18vd); ``bias_decay_mult`` misses the
    attention's ``in_proj_bias``, and ``norm_decay_mult`` reaches the
    norms that v1 names ``input_proj.N.1`` / ``enc_output.1``, which
    upstream's ``norm`` regex does not (r50vd)."""
    ours = port_values(
        ZOO_CONFIGS[(version, name)],
        constructor='DefaultOptimWrapperConstructor',
        paramwise_cfg=MMENGINE_FORM[version])
    diff = differences(ours, upstream_values(version, name))
    assert len(diff) == count, sorted(diff)
    weight_decay = {n: (diff[n][0][1], diff[n][1][1]) for n in diff}
    if name == 'r18vd':
        norms = [
            n for n in diff if n.startswith('backbone.') and (
                '.bn' in n or '.downsample.2.' in n or '.stem.' in n)
        ]
        assert norms and all(weight_decay[n] == (1e-4, 0.) for n in norms)
    else:
        assert {
            n: wd
            for n, wd in weight_decay.items() if n.endswith('in_proj_bias')
        } == {
            f'decoder.layers.{i}.self_attn.in_proj_bias': (1e-4, 0.)
            for i in range(6)
        } | {
            'neck.encoder.0.layers.0.self_attn.in_proj_bias': (1e-4, 0.)
        }
        assert {
            n: wd
            for n, wd in weight_decay.items() if not n.endswith('in_proj_bias')
        } == {
            n: (0., 1e-4)
            for n in ['enc_output.1.weight'] +
            [f'neck.input_proj.{i}.1.weight' for i in range(3)]
        }


def test_constructor_needs_upstream_names_for_upstream_regexes():
    """The port's own names (no ``param_name_map``) miss upstream's
    regexes: e.g. no backbone BN name contains 'norm'."""
    cfg = zoo_config(ZOO_CONFIGS[(1, 'r18vd')])
    paramwise = cfg.optim_wrapper.paramwise_cfg.copy()
    paramwise.param_name_map = None
    ours = port_values(ZOO_CONFIGS[(1, 'r18vd')], paramwise_cfg=paramwise)
    assert differences(ours, upstream_values(1, 'r18vd'))


@pytest.mark.parametrize('version,name', sorted(ZOO_CONFIGS))
def test_multi_scale_sizes_are_upstreams(version, name):
    """Upstream's list of sizes (640 three times), nearest resizing; v2-S
    (``scales: ~``) trains at 640 only."""
    cfg = zoo_config(ZOO_CONFIGS[(version, name)])
    scales = upstream_recipe(version, name)['multi_scale']
    augments = cfg.model.data_preprocessor.get('batch_augments')
    if scales is None:
        assert not augments
        return
    assert len(scales) == 13 and scales.count(640) == 3
    resize, = augments
    assert resize.type == 'BatchChoiceResize'
    assert resize.scales == scales
    assert resize.get('interpolation', 'nearest') == 'nearest'
