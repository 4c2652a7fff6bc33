"""What a D-FINE / DEIM config makes of upstream's recipe, next to what
upstream's own code makes of its YAML (``upstream_recipes``).

Shared by the D-FINE and DEIM config tests. Parameters are compared by the
port's names: upstream's names go through
``tools/convert_dfine_checkpoint.py``, the table official checkpoints load
through; the configs' optimizer constructor uses its own inverse table
(``dfine_upstream_param_names``), so a mistake in either shows.
"""
import copy
import functools
import math
import os.path as osp
from typing import Dict, List, Tuple

import torch
from mmengine.config import Config

from mmddp_ext.testing import model_index_read_once
from . import upstream_recipes as upstream
from .deim_utils import REPO_ROOT, import_deim, import_dfine, import_rtdetr

Values = Dict[str, Tuple[float, float, Tuple[float, float]]]
TRACE_ITERS_PER_EPOCH = 50


def _convert_state_dict(name: str = 'dfine'):
    """The key table ``tools/convert_{name}_checkpoint.py`` runs
    (``name``: 'dfine' or 'rtdetr'), from its project package."""
    if name == 'rtdetr':
        return import_rtdetr().convert_rtdetr_state_dict
    return import_dfine().convert_dfine_state_dict


@functools.lru_cache(maxsize=None)
def _parsed_config(path: str) -> Config:
    """``path`` parsed once per process: the config tests parametrise
    several tests over the same files. Never handed out; see
    ``load_config``."""
    import_deim()
    with model_index_read_once():
        return Config.fromfile(osp.join(REPO_ROOT, path))


def load_config(path: str) -> Config:
    """The parsed config at ``path`` (relative to the repository), a deep
    copy of the once-parsed one: a test may change it freely."""
    return copy.deepcopy(_parsed_config(path))


_META_MODELS: dict = {}


def build_meta_model(cfg: Config):
    """The config's model with shapes only (no memory, no init); the
    config is not changed (mmdet's DINO writes into ``dn_cfg``). Built
    once per process for each distinct ``cfg.model`` (a config's tests
    share it) and then handed out again: callers read its parameters'
    names, shapes and ``requires_grad``, and never change it."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    key = repr(cfg.model.to_dict())
    if key not in _META_MODELS:
        with torch.device('meta'):
            _META_MODELS[key] = MODELS.build(copy.deepcopy(cfg.model))
    return _META_MODELS[key]


def build_optimizer(cfg: Config, model, **overrides):
    """The optimizer MMEngine builds from ``cfg.optim_wrapper`` (its
    ``overrides`` replaced), as a plain ``OptimWrapper``: AMP needs a GPU
    and does not touch the parameter groups."""
    from mmengine.optim import build_optim_wrapper
    optim_cfg = cfg.optim_wrapper.copy()
    optim_cfg.type = 'OptimWrapper'
    optim_cfg.pop('loss_scale', None)
    optim_cfg.update(overrides)
    return build_optim_wrapper(model, optim_cfg).optimizer


def port_values(cfg: Config, **overrides) -> Values:
    """(lr, weight decay, betas) of each trainable parameter, by name."""
    model = build_meta_model(cfg)
    optimizer = build_optimizer(cfg, model, **overrides)
    name_of = {id(p): name for name, p in model.named_parameters()}
    return {
        name_of[id(param)]:
        (group['lr'], group['weight_decay'], tuple(group['betas']))
        for group in optimizer.param_groups
        for param in group['params'] if param.requires_grad
    }


def _by_port_name(record: dict, converter: str, values: dict) -> dict:
    """``values`` (by upstream name) by the port's name, through the
    converter official checkpoints load through."""
    names = list(values)
    tagged = {key: torch.tensor(i) for i, key in enumerate(names)}
    converted = _convert_state_dict(converter)(tagged, log=lambda line: None)
    return {
        port: values[names[int(tag)]]
        for port, tag in converted.items()
        if tag.dim() == 0 and not port.endswith('num_batches_tracked')
    }


def upstream_values(record: dict, converter: str = 'dfine') -> Values:
    """Upstream's (lr, weight decay, betas) by the port's name."""
    return _by_port_name(
        record, converter, {
            name: (group['lr'], group['weight_decay'], tuple(group['betas']))
            for group in upstream.param_groups(record)
            for name in group['params']
        })


def upstream_shapes(record: dict, converter: str = 'dfine') -> dict:
    """Upstream's trainable parameters' shapes by the port's name."""
    data = upstream.load()
    table = record['param_names']
    return _by_port_name(
        record, converter, {
            name: tuple(shape)
            for name, shape in zip(data['parameters'][table],
                                   data['parameter_shapes'][table])
        })


def port_shapes(cfg: Config) -> dict:
    """The config's trainable parameters' shapes, by name."""
    return {
        name: tuple(param.shape)
        for name, param in build_meta_model(cfg).named_parameters()
        if param.requires_grad
    }


def differences(ours: Values, theirs: Values) -> Dict[str, tuple]:
    """Parameters whose values differ; raises if the names differ."""
    assert set(ours) == set(theirs), sorted(set(ours) ^ set(theirs))[:10]
    return {
        name: (ours[name], theirs[name])
        for name in ours
        if not (math.isclose(ours[name][0], theirs[name][0], rel_tol=1e-9)
                and math.isclose(ours[name][1], theirs[name][1], rel_tol=1e-9)
                and ours[name][2] == theirs[name][2])
    }


def lr_trace(cfg: Config, record: dict) -> List[List[float]]:
    """The lr of each group of ``cfg``'s optimizer at the iterations of
    ``record['lr_trace']``, its ``param_scheduler`` built as the Runner
    builds it for a loader of ``iters_per_epoch`` batches."""
    from mmengine.registry import PARAM_SCHEDULERS
    model = build_meta_model(cfg)
    optimizer = build_optimizer(cfg, model)
    per_epoch = record['lr_trace']['iters_per_epoch']
    max_epochs = cfg.train_cfg.max_epochs
    schedulers = []
    for scheduler in cfg.param_scheduler:
        scheduler = scheduler.copy()
        scheduler.setdefault(
            'end',
            max_epochs if scheduler.get('by_epoch', True) else max_epochs *
            per_epoch)
        schedulers.append(
            PARAM_SCHEDULERS.build(
                scheduler,
                default_args=dict(optimizer=optimizer,
                                  epoch_length=per_epoch)))
    points = set(record['lr_trace']['iters'])
    lrs = []
    for step in range(per_epoch * max_epochs):
        if step in points:
            lrs.append([g['lr'] for g in optimizer.param_groups])
        for scheduler in schedulers:
            if not scheduler.by_epoch:
                scheduler.step()
        if (step + 1) % per_epoch == 0:
            for scheduler in schedulers:
                if scheduler.by_epoch:
                    scheduler.step()
    return lrs


def assert_same_lrs(lrs: List[List[float]], expected: List[List[float]]):
    assert len(lrs) == len(expected)
    for got, want in zip(lrs, expected):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15), (got, want)


def hook(cfg: Config, hook_type: str) -> dict:
    found = [h for h in cfg.custom_hooks if h['type'] == hook_type]
    assert len(found) == 1, (hook_type, cfg.custom_hooks)
    return found[0]


def assert_upstream_ema(cfg: Config, yaml: dict) -> None:
    """The config's EMA hook builds a ``ModelEMA`` with the YAML's decay and
    warm-up (``use_ema`` on)."""
    from mmengine.registry import HOOKS
    assert yaml['use_ema'] and yaml['ema']['type'] == 'ModelEMA'
    hook_cfg = dict(hook(cfg, 'ModelEMAHook'))
    hook_cfg.pop('priority', None)  # the Runner's, not the hook's
    ema = HOOKS.build(hook_cfg).ema_cfg
    assert ema == dict(
        type='ModelEMA',
        decay=yaml['ema']['decay'],
        warmups=yaml['ema']['warmups']), ema


def multiscale_sizes(cfg: Config):
    """The sizes of the config's multi-scale batch augment (None: none)."""
    augments = cfg.model.data_preprocessor.get('batch_augments') or []
    for augment in augments:
        if augment['type'] == 'BatchChoiceResize':
            return list(augment['scales'])
        if augment['type'] == 'CollateBatchAugment':
            scales = augment.get('scales')
            return list(scales) if scales else None
    return None
