"""Control activation checkpointing wherever a model calls it, without
reading or editing the model's code.

:func:`install` replaces torch's ``checkpoint`` and ``checkpoint_sequential``
function objects by wrappers everywhere they are referenced: the
attributes of ``torch.utils.checkpoint`` and every module global bound to
the very same object (found by identity, so
``from torch.utils.checkpoint import checkpoint`` in mmdet's HRFPN or in
MMEngine's ``activation_checkpointing`` is covered; an unrelated function
that happens to be called ``checkpoint`` is not). Code imported later gets
the wrappers from ``torch.utils.checkpoint``.

The wrappers behave exactly like torch's until a policy is set with
:func:`set_policy`. Then a call made with grad enabled that does not state
``use_reentrant`` (or passes None, torch's "not stated") follows it:

- ``'non_reentrant'``: runs with ``use_reentrant=False``; the same
  activations are recomputed, so the memory savings stay;
- ``'disable'``: runs the function without checkpointing;
- ``'error'``: raises the exception the policy's ``refuse`` callback builds.

A call that states ``use_reentrant`` keeps what it states.
``checkpoint_sequential`` is wrapped at its entry (it passes its
``use_reentrant`` on to ``checkpoint`` explicitly).

:func:`watch` records which modules of a model call checkpointing: the
innermost frame on the Python stack whose ``self`` is one of the model's
modules at the time of the call. That covers inherited ``forward`` methods,
forwards replaced on the instance and helpers called from ``forward``,
and it records only checkpointing that really runs.
"""
import inspect
import sys
from typing import Callable, Dict, Iterable, Optional, Set

import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint

POLICIES = ('non_reentrant', 'disable', 'error')

# What a call stated as ``use_reentrant``: None (not stated), True, False.
CallRecord = Dict[str, Set[Optional[bool]]]

_originals: Dict[str, Callable] = {}
_RUN_PLAIN = object()


class _State:
    policy: Optional[str] = None
    refuse: Optional[Callable[[Optional[str]], Exception]] = None
    module_names: Dict[int, str] = {}
    recording = False
    calls: CallRecord = {}


def _site_of_call() -> Optional[str]:
    """Name of the innermost module of the watched model on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == 'self':
            name = _State.module_names.get(id(frame.f_locals.get('self')))
            if name is not None:
                return name
        frame = frame.f_back
    return None


def _decide(use_reentrant: Optional[bool]):
    """What a checkpoint call runs with: the ``use_reentrant`` to pass on,
    or ``_RUN_PLAIN`` to run without checkpointing."""
    wants_site = _State.recording or _State.policy == 'error'
    site = _site_of_call() if wants_site else None
    if _State.recording and site is not None:
        _State.calls.setdefault(site, set()).add(use_reentrant)
    if (_State.policy is None or use_reentrant is not None
            or not torch.is_grad_enabled()):
        return use_reentrant
    if _State.policy == 'error':
        raise _State.refuse(site)
    return _RUN_PLAIN if _State.policy == 'disable' else False


def _checkpoint_options() -> Set[str]:
    """Keyword arguments that configure torch's checkpoint rather than the
    checkpointed function: its keyword-only parameters, and
    ``preserve_rng_state``, which it reads from ``**kwargs``."""
    params = inspect.signature(_originals['checkpoint']).parameters.values()
    return {p.name
            for p in params
            if p.kind is p.KEYWORD_ONLY} | {'preserve_rng_state'}


def checkpoint(function,
               *args,
               use_reentrant: Optional[bool] = None,
               **kwargs):
    """``torch.utils.checkpoint.checkpoint`` under the current policy."""
    decided = _decide(use_reentrant)
    if decided is _RUN_PLAIN:
        for option in _checkpoint_options():
            kwargs.pop(option, None)
        return function(*args, **kwargs)
    return _originals['checkpoint'](
        function, *args, use_reentrant=decided, **kwargs)


def checkpoint_sequential(functions,
                          segments: int,
                          input,
                          use_reentrant: Optional[bool] = None,
                          **kwargs):
    """``torch.utils.checkpoint.checkpoint_sequential`` under the current
    policy."""
    decided = _decide(use_reentrant)
    if decided is _RUN_PLAIN:
        if isinstance(functions, nn.Sequential):
            functions = functions.children()
        for function in functions:
            input = function(input)
        return input
    return _originals['checkpoint_sequential'](
        functions, segments, input, use_reentrant=decided, **kwargs)


def rebind(original: Callable, replacement: Callable) -> int:
    """Bind ``replacement`` wherever a loaded module's global is
    ``original`` itself (identity, not name). Returns the count."""
    rebound = 0
    for module in list(sys.modules.values()):
        try:
            namespace = vars(module)
        except TypeError:  # None entries, objects without a __dict__
            continue
        for name, value in list(namespace.items()):
            if value is original:
                setattr(module, name, replacement)
                rebound += 1
    return rebound


def install() -> int:
    """Put the wrappers in place of torch's function objects, in
    ``torch.utils.checkpoint`` and in every loaded module that holds them.

    Modules loaded later find the wrappers in ``torch.utils.checkpoint``,
    so one pass is enough; later calls return 0 unless something put
    other functions in ``torch.utils.checkpoint`` since. Returns how many
    references were replaced.
    """
    wrappers = {
        'checkpoint': checkpoint,
        'checkpoint_sequential': checkpoint_sequential
    }
    if not _originals:
        _originals.update(
            {name: getattr(torch_checkpoint, name)
             for name in wrappers})
    return sum(
        rebind(_originals[name], wrapper)
        for name, wrapper in wrappers.items()
        if getattr(torch_checkpoint, name) is not wrapper)


def set_policy(
        policy: Optional[str],
        refuse: Optional[Callable[[Optional[str]], Exception]] = None) -> None:
    """Set the process-wide policy for checkpoint calls that do not state
    ``use_reentrant`` (None: torch's own behaviour).

    ``refuse(site)`` builds the exception raised under ``'error'``; ``site``
    is the calling module's name in the watched model, or None.
    """
    if policy is not None and policy not in POLICIES:
        raise ValueError(f'activation checkpoint policy must be None or one '
                         f'of {POLICIES}, but got {policy!r}.')
    if policy == 'error' and refuse is None:
        raise ValueError("policy 'error' needs a refuse callback.")
    if policy is not None:
        install()
    _State.policy, _State.refuse = policy, refuse


def current_policy() -> Optional[str]:
    return _State.policy


def watch(model: nn.Module) -> None:
    """Start recording which of ``model``'s modules call checkpointing."""
    install()
    _State.module_names = {
        id(module): name
        for name, module in model.named_modules()
    }
    _State.calls = {}
    _State.recording = True


def stop_recording() -> CallRecord:
    """Stop recording; returns ``{module name: use_reentrant values}``."""
    _State.recording = False
    return {name: set(stated) for name, stated in _State.calls.items()}


def reset() -> None:
    """Back to torch's behaviour: no policy, no watched model."""
    set_policy(None)
    _State.recording = False
    _State.module_names, _State.calls = {}, {}


def merge_records(records: Iterable[CallRecord]) -> CallRecord:
    """One record from several (one per rank), in first-seen order."""
    merged: CallRecord = {}
    for record in records:
        for name, stated in record.items():
            merged.setdefault(name, set()).update(stated)
    return merged


def config_key(model: nn.Module, site_name: str) -> Optional[str]:
    """The config key that switches a site on, taken from its outermost
    ancestor whose ``with_cp`` is on: in a detector ``'backbone.layer1.0'``
    -> ``'model.backbone.with_cp'``. None if no module on the path has
    ``with_cp`` on."""
    parts = site_name.split('.') if site_name else []
    for depth in range(len(parts) + 1):
        module = model.get_submodule('.'.join(parts[:depth]))
        if getattr(module, 'with_cp', None):
            return '.'.join(['model'] + parts[:depth] + ['with_cp'])
    return None
