"""Static config checks: the DDP set-up a launch would resolve to, read
from the config and the built (not run) model."""
import difflib
from typing import Any, List

import torch.nn as nn

from ..hooks.rank_consistency_hook import move_skip_args
from ..runner.ddp_setup import DDPSetup
from ..runner.ext_cfg import EXT_CFG_DEFAULTS, checked_ext_cfg
from ..utils.text import shorten
from ..utils.torch_private import BatchNormBase
from . import checkpoint_sites
from .cpu_twins import sync_batch_norm_layers
from .report import BLOCKER, OK, WARN, Check

PHASE = 'config'
SMALL_BATCH = 2


def check_wrapper(setup: DDPSetup) -> Check:
    return Check(
        PHASE, 'model wrapper', OK, setup.describe() +
        ('' if setup.auto_ddp else '; the dynamic checks show whether the '
         'model needs find_unused_parameters'))


def check_checkpointing(setup: DDPSetup,
                        model: nn.Module,
                        activation_checkpointing=(),
                        probed: bool = False) -> Check:
    """Checkpointing switched on in the built model against the DDP flag.
    With ``probed``, the dynamic check (which sees the parameters hidden
    in the iterations) gives the verdict on a conflict; this one warns."""
    name = 'activation checkpointing'
    names = checkpoint_sites.switched_on(model, activation_checkpointing)
    if not names:
        return Check(PHASE, name, OK, 'no activation checkpointing')
    keys = checkpoint_sites.config_keys(model, names)
    listed = shorten(names)
    details = dict(modules=names, config_keys=keys)
    resolved = setup.checkpoint_policy in ('non_reentrant', 'disable')
    if resolved:
        return Check(
            PHASE, name, OK,
            f'{len(names)} checkpointing module(s) ({listed}); '
            f"CheckpointConflictHook policy '{setup.checkpoint_policy}' "
            'resolves any conflict with DDP', details=details)
    if setup.find_unused and probed:
        return Check(
            PHASE, name, WARN,
            f'reentrant checkpointing in {len(names)} module(s) ({listed}) '
            'with find_unused_parameters=True: a conflict wherever these '
            "modules' parameters reach the loss; dynamic/checkpointing and "
            'DDP gives the verdict from the iterations',
            fix=[f'# or: {k}=False' for k in keys][:1],
            details=details)
    if setup.find_unused:
        stops = setup.checkpoint_policy == 'error'
        return Check(
            PHASE, name, BLOCKER,
            f'reentrant checkpointing in {len(names)} module(s) ({listed}) '
            'with find_unused_parameters=True',
            on_gpus=('CheckpointConflictHook(policy=\'error\') stops before '
                     'training.' if stops else
                     'every rank fails in the first backward with '
                     "'Expected to mark a variable ready only once'."),
            fix=[
                "_base_ = ['./your_config.py', "
                "'<mmddp_ext>/configs/_base_/mmddp_ext.py']"
                '  # non-reentrant checkpointing, memory savings kept',
                '# or: ' + ', '.join(f'{k}=False' for k in keys),
            ],
            details=details)
    return Check(
        PHASE, name, WARN if setup.auto_ddp else OK,
        f'{len(names)} reentrant checkpointing module(s) ({listed}); fine '
        'with find_unused_parameters=False' +
        ('; a conflict if AutoDDP has to choose find_unused_parameters=True '
         'and no CheckpointConflictHook is on' if setup.auto_ddp else ''),
        fix=["custom_hooks = [dict(type='CheckpointConflictHook')]"]
        if setup.auto_ddp else [],
        details=details)


def check_data_loading(cfg, setup: DDPSetup) -> Check:
    loader = cfg.get('train_dataloader') or {}
    dataset = loader.get('dataset') or {}
    while 'dataset' in dataset and 'filter_cfg' not in dataset:
        dataset = dataset['dataset']
    filter_cfg = dataset.get('filter_cfg') or {}
    sampler = loader.get('sampler') or {}
    batch_sampler = loader.get('batch_sampler') or {}
    parts = [
        f"collate_fn {setup.collate.get('type')}",
        f"filter_empty_gt={filter_cfg.get('filter_empty_gt', False)}",
        f"sampler {sampler.get('type', 'none')} "
        f"(shuffle={sampler.get('shuffle', '?')})",
    ]
    if batch_sampler:
        parts.append(f"batch_sampler {batch_sampler.get('type')}")
    keeps_empty = not filter_cfg.get('filter_empty_gt', False)
    note = ('; images without GT reach the model, so a rank can get a '
            'batch without any box (see the dynamic checks)'
            if keeps_empty else '; images without GT are filtered out')
    return Check(PHASE, 'collate, filter_empty_gt, sampler', OK,
                 ', '.join(parts) + note)


def check_auto_scale_lr(cfg, nproc: int) -> Check:
    name = 'auto_scale_lr'
    batch = (cfg.get('train_dataloader') or {}).get('batch_size', 1)
    total = batch * nproc
    scale = cfg.get('auto_scale_lr') or {}
    base = scale.get('base_batch_size')
    if base is None:
        return Check(PHASE, name, OK,
                     f'no auto_scale_lr; the learning rate is used as set '
                     f'for {nproc} x {batch} = {total} images per step')
    if scale.get('enable'):
        return Check(PHASE, name, OK,
                     f'enabled: lr x {total}/{base} = {total / base:g} for '
                     f'{nproc} ranks x {batch} images')
    if base == total:
        return Check(PHASE, name, OK,
                     f'base_batch_size {base} equals {nproc} x {batch}')
    return Check(
        PHASE, name, WARN,
        f'the learning rate is tuned for base_batch_size={base}, but '
        f'{nproc} ranks x {batch} images = {total} per step, and '
        'auto_scale_lr is off',
        on_gpus=f'trains with an lr {base / total:g}x too '
        f"{'high' if base > total else 'low'} for this batch.",
        fix=['auto_scale_lr = dict(enable=True)  # or tools/train.py '
             '--auto-scale-lr'])


def check_sync_bn(cfg, nproc: int, model: nn.Module) -> Check:
    """BatchNorm layers that use batch statistics in training (those in
    training mode after ``model.train()``; ``norm_eval=True`` keeps a
    backbone's in eval mode) normalise over one rank's images unless they
    are synchronised."""
    name = 'sync_bn'
    model.train()
    batch_stats = [
        n for n, m in model.named_modules()
        if isinstance(m, BatchNormBase) and m.training
    ]
    synced = sync_batch_norm_layers(model)
    batch = (cfg.get('train_dataloader') or {}).get('batch_size', 1)
    if cfg.get('sync_bn'):
        return Check(PHASE, name, OK,
                     f"sync_bn='{cfg.sync_bn}': BatchNorm statistics over "
                     f'all {nproc} ranks on GPUs (CPU ranks: ExtRunner '
                     "skips it, the doctor's probe runs its CPU twin)")
    if synced:
        return Check(PHASE, name, OK,
                     f'{synced} SyncBatchNorm layer(s) in the model: '
                     f'statistics over all {nproc} ranks')
    if batch_stats and batch <= SMALL_BATCH and nproc > 1:
        return Check(
            PHASE, name, WARN,
            f'{len(batch_stats)} BatchNorm layer(s) use batch statistics in '
            f'training (e.g. {batch_stats[0]}) and normalise over {batch} '
            'image(s) per rank',
            on_gpus='trains with noisy per-GPU BatchNorm statistics.',
            fix=["sync_bn = 'torch'",
                 '# or use their running statistics: '
                 'model = dict(backbone=dict(norm_eval=True))'],
            details=dict(layers=batch_stats))
    return Check(PHASE, name, OK,
                 f'{len(batch_stats)} BatchNorm layer(s) use batch '
                 f'statistics in training, {batch} image(s) per rank')


def _mmddp_ext_types(node: Any) -> List[str]:
    """Component types in the config that mmddp_ext registers (the class's
    module says where it comes from)."""
    from mmengine.registry import (FUNCTIONS, HOOKS, MODEL_WRAPPERS, MODELS,
                                   RUNNERS)
    found = []
    if isinstance(node, dict):
        type_name = node.get('type')
        if isinstance(type_name, str):
            for registry in (MODELS, HOOKS, MODEL_WRAPPERS, FUNCTIONS,
                             RUNNERS):
                cls = registry.get(type_name)
                if getattr(cls, '__module__', '').startswith('mmddp_ext'):
                    found.append(type_name)
                    break
        for value in node.values():
            found += _mmddp_ext_types(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            found += _mmddp_ext_types(value)
    return found


def _corrected_ext_cfg(given: dict) -> dict:
    """``given`` with a misspelt key under its closest accepted name, an
    unknown one dropped, and ``rank_consistency``'s skip keys moved to
    ``nonfinite_skip`` (``RankConsistencyHook``'s module moves them:
    :func:`~mmddp_ext.hooks.rank_consistency_hook.move_skip_args`)."""
    known = {k: v for k, v in given.items() if k in EXT_CFG_DEFAULTS}
    for key in sorted(set(given) - set(EXT_CFG_DEFAULTS)):
        close = difflib.get_close_matches(key, EXT_CFG_DEFAULTS, 1)
        if close:
            known.setdefault(close[0], given[key])
    return move_skip_args(known)


def check_coherence(cfg, setup: DDPSetup) -> Check:
    name = 'mmddp_ext settings'
    given = cfg.get('mmddp_ext_cfg')
    if given is not None:
        try:
            checked_ext_cfg(given)
        except (TypeError, ValueError) as error:
            fix = ['mmddp_ext_cfg = dict()  # keys: ' +
                   ', '.join(sorted(EXT_CFG_DEFAULTS))]
            if isinstance(given, dict):
                fix = [f'mmddp_ext_cfg = {_corrected_ext_cfg(given)!r}  # '
                       f"accepted keys: {', '.join(sorted(EXT_CFG_DEFAULTS))}"]
            return Check(
                PHASE, name, BLOCKER if setup.opted_in else WARN, str(error),
                on_gpus=('ExtRunner refuses the config at start-up.'
                         if setup.opted_in else 'ignored: the runner is '
                         f'{setup.runner_type}.'),
                fix=fix)
        if not setup.opted_in:
            return Check(
                PHASE, name, WARN,
                f'mmddp_ext_cfg is set, but runner_type is '
                f"'{setup.runner_type}', which ignores it: none of those "
                'fixes is on', fix=["runner_type = 'ExtRunner'"])
    notes = []
    if setup.opted_in and setup.ext_cfg.get('auto_ddp') and cfg.get(
            'model_wrapper_cfg') is not None:
        notes.append('model_wrapper_cfg is set, so mmddp_ext_cfg.auto_ddp '
                     'has no effect')
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    used = sorted(set(_mmddp_ext_types(cfg._cfg_dict.to_dict())))
    # With runner_type='ExtRunner' something already imports mmddp_ext
    # (the opt-in base file, or mmddp_ext's tools/train.py).
    if used and not setup.opted_in and not any(
            i.split('.')[0] == 'mmddp_ext' for i in imports):
        notes.append(
            f"the config uses mmddp_ext's {', '.join(used)}, but nothing "
            "imports mmddp_ext: fine with mmddp_ext's tools/train.py, "
            "unknown types with MMDetection's own tools/train.py")
    if notes:
        return Check(PHASE, name, WARN, '; '.join(notes),
                     fix=["custom_imports = dict(imports=['mmddp_ext'], "
                          'allow_failed_imports=False)'] if used else [])
    return Check(PHASE, name, OK,
                 'mmddp_ext ' + ('switched on: ' + ', '.join(
                     k for k, v in setup.ext_cfg.items()
                     if v not in (None, False))
                                 if setup.opted_in else 'not used') +
                 f", runner {setup.runner_type}")


def config_checks(cfg,
                  nproc: int,
                  setup: DDPSetup,
                  model: nn.Module,
                  probed: bool = False) -> List[Check]:
    """The config checks; ``probed``: the dynamic probe runs after them."""
    return [
        check_wrapper(setup),
        check_checkpointing(setup, model,
                            cfg.get('activation_checkpointing') or (),
                            probed),
        check_data_loading(cfg, setup),
        check_auto_scale_lr(cfg, nproc),
        check_sync_bn(cfg, nproc, model),
        check_coherence(cfg, setup),
    ]
