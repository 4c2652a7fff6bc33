"""Find activation-checkpointing sites in a model and make them
non-reentrant without editing upstream code.

A *site* is a module whose class calls ``torch.utils.checkpoint`` in its
own code (mmdet's ResNet/Swin blocks, our DETR encoders) while its
``with_cp`` switch (a bool, or a layer count on DETR encoders) is on, or
whose code calls it unconditionally without an explicit
``use_reentrant``.

Upstream code calls ``torch.utils.checkpoint.checkpoint(fn, x)`` without
``use_reentrant``, which is reentrant on this torch. :func:`install_scope`
wraps that function once; inside the forward of a module marked with
:func:`mark_non_reentrant` (and only there) a call that does not name
``use_reentrant`` gets ``use_reentrant=False``. Everything else keeps
torch's behaviour.
"""
import functools
import inspect
import re
import threading
from typing import Dict, List, NamedTuple

import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

# `cp.checkpoint(`, `checkpoint(`; not `load_checkpoint(`.
_CHECKPOINT_CALL = re.compile(r'(?<!\w)checkpoint(_sequential)?\s*\(')
_SOURCE_CACHE: Dict[type, str] = {}
_scope = threading.local()
_MARK = '_mmddp_non_reentrant_handles'


class CheckpointSite(NamedTuple):
    """A module that checkpoints its activations."""
    name: str
    module: nn.Module
    switchable: bool  # has a `with_cp` switch that 'disable' can turn off
    explicit_reentrant: bool  # its code names use_reentrant itself


def _class_source(cls: type) -> str:
    if cls not in _SOURCE_CACHE:
        try:
            _SOURCE_CACHE[cls] = inspect.getsource(cls)
        except (OSError, TypeError):
            _SOURCE_CACHE[cls] = ''
    return _SOURCE_CACHE[cls]


def find_checkpoint_sites(model: nn.Module) -> List[CheckpointSite]:
    """Every module of ``model`` that checkpoints activations now."""
    sites = []
    for name, module in model.named_modules():
        source = _class_source(type(module))
        if not _CHECKPOINT_CALL.search(source):
            continue
        switch = getattr(module, 'with_cp', None)
        if switch is not None and not switch:
            continue
        sites.append(
            CheckpointSite(name, module, switch is not None,
                           'use_reentrant' in source))
    return sites


def config_key(model: nn.Module, site_name: str) -> str:
    """The config key that switches a site, taken from its outermost
    ancestor with a ``with_cp`` attribute: in a detector
    ``'backbone.layer1.0'`` -> ``'model.backbone.with_cp'``."""
    parts = site_name.split('.') if site_name else []
    for depth in range(len(parts) + 1):
        prefix = '.'.join(parts[:depth])
        module = model.get_submodule(prefix)
        if hasattr(module, 'with_cp'):
            return '.'.join(['model'] + parts[:depth] + ['with_cp'])
    return f'model.{site_name}.with_cp'


def disable(site: CheckpointSite) -> None:
    """Turn a switchable site's checkpointing off (``with_cp`` falsy)."""
    current = site.module.with_cp
    site.module.with_cp = 0 if isinstance(current, int) and not isinstance(
        current, bool) else False


def _checkpoint_in_scope(original):

    @functools.wraps(original)
    def checkpoint(function, *args, **kwargs):
        if getattr(_scope, 'depth', 0) > 0 and 'use_reentrant' not in kwargs:
            kwargs['use_reentrant'] = False
        return original(function, *args, **kwargs)

    checkpoint._mmddp_original = original
    return checkpoint


def install_scope() -> None:
    """Wrap ``torch.utils.checkpoint.checkpoint`` once (idempotent)."""
    current = torch_checkpoint.checkpoint
    if not hasattr(current, '_mmddp_original'):
        torch_checkpoint.checkpoint = _checkpoint_in_scope(current)


def _enter(module, args):
    _scope.depth = getattr(_scope, 'depth', 0) + 1


def _leave(module, args, output):
    _scope.depth -= 1


def mark_non_reentrant(module: nn.Module) -> None:
    """Make checkpoint calls made during ``module``'s forward default to
    ``use_reentrant=False``."""
    install_scope()
    if getattr(module, _MARK, None):
        return
    setattr(module, _MARK, (module.register_forward_pre_hook(_enter),
                            module.register_forward_hook(
                                _leave, always_call=True)))


def is_marked_non_reentrant(module: nn.Module) -> bool:
    return bool(getattr(module, _MARK, None))
