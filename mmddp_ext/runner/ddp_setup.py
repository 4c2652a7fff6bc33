"""The DDP set-up a launch of a config resolves to, decided in one place.

This module is the one front door for what ``mmddp_ext_cfg`` and the
config decide about a launch: the keys' defaults (:data:`EXT_CFG_DEFAULTS`,
:func:`checked_ext_cfg`), whether the config is an ``ExtRunner`` one
(:func:`opted_in`, :func:`ext_cfg_of`), the hooks ``ExtRunner`` registers
with their arguments (:func:`ext_hooks`) and the wrapper with its
``device_ids`` (:func:`resolve_ddp_setup`, :func:`ddp_device_ids`).
``ExtRunner``, the DDP doctor and ``tools/train.py`` read them here. The
rules of :func:`resolve_ddp_setup`, in order:

- wrapper: ``model_wrapper_cfg`` when the config sets it (a top-level
  ``find_unused_parameters`` is then ignored, as stock MMEngine ignores
  it); else ``AutoDDP`` when ``mmddp_ext_cfg.auto_ddp`` is on, with a
  top-level ``find_unused_parameters`` passed on as the user's explicit
  choice (None lets AutoDDP decide); else stock MMEngine's default,
  ``MMDistributedDataParallel(broadcast_buffers=False,
  find_unused_parameters=bool(find_unused_parameters))``;
- ``device_ids`` (for a wrapper derived from ``DistributedDataParallel``,
  unless ``model_wrapper_cfg`` sets them): ``[index]`` of the rank's CUDA
  device, None on CPU ranks (DDP refuses them there; stock MMEngine
  passes ``[LOCAL_RANK]`` always);
- ``sync_bn``: converts the model on a GPU launch; on CPU ranks
  ``ExtRunner`` skips it (torch's ``SyncBatchNorm`` runs on GPUs only);
- activation-checkpointing policy: a ``CheckpointConflictHook`` listed in
  ``custom_hooks`` (its ``policy``) wins over
  ``mmddp_ext_cfg.checkpoint_conflict``;
- train collate function: the dataloader's own ``collate_fn`` wins over
  ``mmddp_ext_cfg.empty_gt_guard``; stock MMEngine's is
  ``pseudo_collate``;
- hooks: those of :func:`ext_hooks`; one the config lists itself (in
  ``custom_hooks``) runs with the config's arguments instead.

``mmddp_ext_cfg`` takes effect only with ``ExtRunner`` (or a subclass);
a config on another runner resolves as if every key were off.
"""
import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from mmengine.registry import HOOKS, MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

from ..hooks.checkpoint_conflict_hook import CheckpointConflictHook
from ..hooks.rank_consistency_hook import (MOVED_TO_NONFINITE_SKIP,
                                           RankConsistencyHook)
from ..wrappers.auto_ddp import AutoDDP

STOCK_WRAPPER = 'MMDistributedDataParallel'
STOCK_COLLATE = dict(type='pseudo_collate')
_FROM_CFG = object()

# mmddp_ext_cfg keys and their values when the key is absent (documented
# in ExtRunner's docstring and docs/design.md).
EXT_CFG_DEFAULTS = dict(
    auto_ddp=False,
    checkpoint_conflict=None,
    cpu_amp=True,
    empty_gt_guard=None,
    empty_gt_stats=False,
    exact_resume=True,
    finite_predictions=True,
    nonfinite_skip=None,
    preemption=dict(),
    rank_consistency=None,
)


def checked_ext_cfg(
        given: Any,
        defaults: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """``mmddp_ext_cfg`` (``given``, None for unset) over ``defaults``
    (:data:`EXT_CFG_DEFAULTS` unless given).

    Raises:
        TypeError: ``given`` is not a dict, or ``finite_predictions`` is
            not a bool.
        ValueError: ``given`` has keys ``defaults`` does not know, or
            ``rank_consistency`` sets a key that belongs to
            ``nonfinite_skip``.
    """
    defaults = EXT_CFG_DEFAULTS if defaults is None else defaults
    given = given or {}
    if not isinstance(given, dict):
        raise TypeError('mmddp_ext_cfg must be a dict, but got '
                        f'{type(given).__name__}.')
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f'mmddp_ext_cfg has unknown key(s) {unknown}; accepted keys '
            f'are {sorted(defaults)}.')
    ext = dict(defaults, **given)
    finite = ext.get('finite_predictions', True)
    if not isinstance(finite, bool):
        raise TypeError(
            'mmddp_ext_cfg.finite_predictions must be True (score '
            'non-finite predictions as misses) or False (stock '
            f'evaluation), but got {finite!r} ({type(finite).__name__}).')
    checks = ext.get('rank_consistency')
    moved = sorted(
        set(checks if isinstance(checks, dict) else ())
        & set(MOVED_TO_NONFINITE_SKIP))
    if moved:
        raise ValueError(
            f'mmddp_ext_cfg.rank_consistency sets {moved}, but '
            'RankConsistencyHook only checks that the ranks agree; skipping '
            "steps with a non-finite loss is NonFiniteSkipHook's, under "
            'mmddp_ext_cfg.nonfinite_skip. Remove them from rank_consistency '
            'and set nonfinite_skip=dict(max_consecutive_skips=N) to skip '
            '(N defaults to 5), or nonfinite_skip=None not to.')
    return ext


def runner_class(cfg) -> Optional[type]:
    """The class ``cfg.runner_type`` names (``Runner`` when unset), looked
    up in the config's ``default_scope``; None when no registry knows it."""
    from mmengine.registry import RUNNERS
    runner_type = cfg.get('runner_type') or 'Runner'
    if isinstance(runner_type, type):
        return runner_type
    with RUNNERS.switch_scope_and_registry(
            cfg.get('default_scope')) as registry:
        cls = registry.get(runner_type)
    return cls if isinstance(cls, type) else None


def opted_in(cfg) -> bool:
    """Whether ``mmddp_ext_cfg`` takes effect for ``cfg``: its runner is
    ``ExtRunner`` or derives from it (the runner says so in its class
    attribute ``reads_mmddp_ext_cfg``, which subclasses inherit, so this
    module, which ``ExtRunner`` imports, need not import it back)."""
    cls = runner_class(cfg)
    return (isinstance(cls, type)
            and getattr(cls, 'reads_mmddp_ext_cfg', False) is True)


def ext_cfg_of(cfg, strict: bool = True) -> Optional[Dict[str, Any]]:
    """``cfg``'s ``mmddp_ext_cfg`` with its defaults, checked; None when
    the runner is not an ``ExtRunner`` (every key off).

    Args:
        cfg (Config): The config.
        strict (bool): Raise on an invalid ``mmddp_ext_cfg``, as
            ``ExtRunner`` does at start-up; False gives the defaults
            instead (the DDP doctor reports the error in a check of its
            own). Defaults to True.
    """
    if not opted_in(cfg):
        return None
    try:
        return checked_ext_cfg(cfg.get('mmddp_ext_cfg'))
    except (TypeError, ValueError):
        if strict:
            raise
        return dict(EXT_CFG_DEFAULTS)


def ext_hooks(
        ext_cfg: Optional[Dict[str, Any]]) -> List[Tuple[str, Dict[str, Any]]]:
    """The hooks ``ExtRunner`` registers beside the config's, as ``(type
    name, keyword arguments)``, in this order: ``SafeCheckpointHook`` and
    ``RankStatusHook`` always, then those ``ext_cfg`` switches on.

    Args:
        ext_cfg (dict, optional): ``mmddp_ext_cfg`` as
            :func:`checked_ext_cfg` gives it; None for a runner that is not
            an ``ExtRunner`` (no hooks).

    ``ExtRunner.register_hooks`` leaves out a hook whose type the runner
    already has (the config's, which keeps the config's arguments).
    """
    if ext_cfg is None:
        return []
    hooks: List[Tuple[str, Dict[str, Any]]] = [('SafeCheckpointHook', {}),
                                               ('RankStatusHook', {})]
    if ext_cfg['checkpoint_conflict'] is not None:
        hooks.append(('CheckpointConflictHook',
                      dict(policy=ext_cfg['checkpoint_conflict'])))
    if ext_cfg['empty_gt_stats']:
        hooks.append(('EmptyGTStatsHook', {}))
    if ext_cfg['finite_predictions']:
        hooks.append(('FinitePredictionsHook', {}))
    if ext_cfg['rank_consistency'] is not None:
        hooks.append(('RankConsistencyHook',
                      dict(ext_cfg['rank_consistency'])))
    if ext_cfg['nonfinite_skip'] is not None:
        hooks.append(('NonFiniteSkipHook', dict(ext_cfg['nonfinite_skip'])))
    if ext_cfg['preemption'] is not None:
        hooks.append(('PreemptionHook', dict(ext_cfg['preemption'])))
    return hooks


def ddp_device_ids(device: Union[str, torch.device]) -> Optional[List[int]]:
    """``device_ids`` for ``DistributedDataParallel`` wrapping a model on
    ``device``: ``[index]`` for one CUDA device, None for any other device
    (DDP refuses ``device_ids`` for a CPU model).

    Raises:
        ValueError: ``device`` is CUDA without an index (the device a rank
            uses is known on that rank only).
    """
    device = torch.device(device)
    if device.type != 'cuda':
        return None
    if device.index is None:
        raise ValueError(
            "ddp_device_ids needs the rank's own device, e.g. "
            f"torch.device('cuda', 0), but got {str(device)!r}.")
    return [device.index]


def _resolves_to(registry, type_name: Any, base: type) -> bool:
    cls = registry.get(type_name) if isinstance(type_name, str) else type_name
    return isinstance(cls, type) and issubclass(cls, base)


def listed_hook(cfg, base: type) -> Optional[dict]:
    """The first ``custom_hooks`` entry whose type is ``base`` or derives
    from it."""
    for hook in cfg.get('custom_hooks') or []:
        if isinstance(hook, dict) and _resolves_to(HOOKS, hook.get('type'),
                                                   base):
            return dict(hook)
    return None


def wrapper_cfg(model_wrapper_cfg: Optional[dict], auto_ddp: bool,
                find_unused: Optional[bool]) -> Dict[str, Any]:
    """The ``model_wrapper_cfg`` a distributed launch builds (a copy),
    before ``device_ids``."""
    if model_wrapper_cfg is None and auto_ddp:
        return dict(
            type='AutoDDP',
            broadcast_buffers=False,
            find_unused_parameters=find_unused)
    if model_wrapper_cfg is None:
        # The arguments stock Runner uses when no wrapper is configured.
        return dict(
            type=STOCK_WRAPPER,
            broadcast_buffers=False,
            find_unused_parameters=bool(find_unused))
    resolved = copy.deepcopy(dict(model_wrapper_cfg))
    resolved.setdefault('type', STOCK_WRAPPER)
    return resolved


def train_collate_cfg(loader_cfg: Optional[dict],
                      ext_cfg: Dict[str, Any]) -> Optional[dict]:
    """The train ``collate_fn`` config in effect; None for the dataloader's
    default (``pseudo_collate``)."""
    collate = (loader_cfg or {}).get('collate_fn')
    guard = ext_cfg.get('empty_gt_guard')
    if collate is None and guard is not None:
        collate = dict(type='empty_gt_guard_collate', **guard)
    return collate


@dataclass
class DDPSetup:
    """What a distributed launch of a config uses.

    Args:
        runner_type (str): The runner type name ('Runner' when unset).
        opted_in (bool): ``mmddp_ext_cfg`` takes effect (the runner is
            ``ExtRunner`` or derives from it).
        ext_cfg (dict): ``mmddp_ext_cfg`` with its defaults; empty when not
            opted in.
        wrapper_cfg (dict): The ``model_wrapper_cfg`` the launch builds.
        wrapper (str): Its type name.
        auto_ddp (bool): The wrapper is ``AutoDDP`` or derives from it.
        find_unused (bool | None): ``find_unused_parameters`` as the wrapper
            gets it; None lets AutoDDP decide after its probe step.
        sync_bn (str | None): ``sync_bn`` as it applies on ``device``.
        sync_bn_skipped (bool): ``sync_bn`` is set, but skipped on ``device``
            (CPU ranks).
        checkpoint_policy (str | None): ``CheckpointConflictHook`` policy, or
            None without that hook.
        rank_consistency (bool): ``RankConsistencyHook`` is on.
        collate (dict): The train ``collate_fn`` config in effect.
        hooks (list[tuple[str, dict]]): The hooks ``ExtRunner`` adds
            (:func:`ext_hooks`) but for those ``custom_hooks`` lists.
    """
    runner_type: str
    opted_in: bool
    ext_cfg: Dict[str, Any]
    wrapper_cfg: Dict[str, Any]
    wrapper: str
    auto_ddp: bool
    find_unused: Optional[bool]
    sync_bn: Optional[str] = None
    sync_bn_skipped: bool = False
    checkpoint_policy: Optional[str] = None
    rank_consistency: bool = False
    collate: Dict[str, Any] = field(default_factory=dict)
    hooks: List[Tuple[str, Dict[str, Any]]] = field(default_factory=list)

    def describe(self) -> str:
        flag = ('decided by AutoDDP after its first step'
                if self.find_unused is None else str(self.find_unused))
        return (f'{self.wrapper} (find_unused_parameters: {flag}), runner '
                f'{self.runner_type}, mmddp_ext '
                f'{"on" if self.opted_in else "off"}')


def resolve_ddp_setup(cfg,
                      ext_cfg: Any = _FROM_CFG,
                      device: Union[str, torch.device] = 'cuda',
                      model_wrapper_cfg: Any = _FROM_CFG) -> DDPSetup:
    """Resolve ``cfg``'s DDP set-up for a launch on ``device``.

    Args:
        cfg (Config): The config.
        ext_cfg (dict, optional): ``mmddp_ext_cfg`` with its defaults, as
            ``ExtRunner.ext_cfg`` gives it; None when the runner is not an
            ``ExtRunner`` (every key off). Defaults to
            ``ext_cfg_of(cfg, strict=False)``.
        device (str | torch.device): ``'cuda'`` for a GPU launch, a CUDA
            device with its index for one rank's launch (it also sets
            ``device_ids``), ``'cpu'`` for CPU ranks. Defaults to 'cuda'.
        model_wrapper_cfg (dict, optional): The wrapper config the runner
            got; defaults to ``cfg.model_wrapper_cfg``.
    """
    if ext_cfg is _FROM_CFG:
        ext_cfg = ext_cfg_of(cfg, strict=False)
    ext = dict(ext_cfg or {})
    device = torch.device(device)
    given_wrapper = (cfg.get('model_wrapper_cfg')
                     if model_wrapper_cfg is _FROM_CFG else model_wrapper_cfg)
    resolved = wrapper_cfg(given_wrapper, bool(ext.get('auto_ddp')),
                           cfg.get('find_unused_parameters', None))
    wrapper = resolved['type']
    if (_resolves_to(MODEL_WRAPPERS, wrapper, DistributedDataParallel)
            and (device.type != 'cuda' or device.index is not None)):
        resolved.setdefault('device_ids', ddp_device_ids(device))
    auto_ddp = _resolves_to(MODEL_WRAPPERS, wrapper, AutoDDP)
    find_unused = resolved.get('find_unused_parameters', None)
    if not auto_ddp:
        find_unused = bool(find_unused)
    sync_bn = cfg.get('sync_bn', None)
    skipped = sync_bn is not None and device.type == 'cpu'

    hooks = [(name, kwargs) for name, kwargs in ext_hooks(ext_cfg)
             if listed_hook(cfg, HOOKS.get(name)) is None]
    listed = listed_hook(cfg, CheckpointConflictHook)
    policy = dict(hooks).get('CheckpointConflictHook', {}).get('policy')
    if listed is not None:
        policy = listed.get('policy', 'non_reentrant')
    collate = train_collate_cfg(cfg.get('train_dataloader'), ext)
    runner_type = cfg.get('runner_type') or 'Runner'
    return DDPSetup(
        runner_type=getattr(runner_type, '__name__', str(runner_type)),
        opted_in=ext_cfg is not None,
        ext_cfg=ext,
        wrapper_cfg=resolved,
        wrapper=getattr(wrapper, '__name__', str(wrapper)),
        auto_ddp=auto_ddp,
        find_unused=find_unused,
        sync_bn=None if skipped else sync_bn,
        sync_bn_skipped=skipped,
        checkpoint_policy=policy,
        rank_consistency=(
            'RankConsistencyHook' in dict(hooks)
            or listed_hook(cfg, RankConsistencyHook) is not None),
        collate=dict(collate or STOCK_COLLATE),
        hooks=hooks)


# Keys only AmpOptimWrapper takes.
AMP_ONLY_KEYS = ('loss_scale', 'dtype', 'use_fsdp')
# AmpOptimWrapper dtypes ExtAmpOptimWrapper runs (None: float16).
AMP_DTYPES = (None, 'float16', 'bfloat16', torch.float16, torch.bfloat16)


@dataclass
class Precision:
    """How a launch on a device runs a config's ``optim_wrapper``.

    Args:
        optim_wrapper (dict | Any): The config to build (a copy where it
            changed; the given object where not).
        amp (bool): Mixed precision runs (autocast and a loss scaler).
        dtype (str): ``'float16'``, ``'bfloat16'`` or ``'float32'``.
        device (str): The device it was resolved for.
        reason (str): Why, for the log; empty when the config runs as
            written with no AMP involved.
    """
    optim_wrapper: Any
    amp: bool
    dtype: str
    device: str
    reason: str = ''

    def describe(self) -> str:
        if not self.amp:
            return f'float32 on {self.device}' + (
                f' ({self.reason})' if self.reason else '')
        return (f'mixed precision on {self.device}: {self.dtype} autocast '
                f'with a loss scaler ({self.reason})')


def resolve_precision(optim_wrapper: Any, device: str,
                      cpu_amp: bool = True) -> Precision:
    """The precision a launch on ``device`` trains ``optim_wrapper`` in.

    An ``AmpOptimWrapper`` config (that exact type: a subclass is the
    user's own and runs as written) builds
    :class:`~mmddp_ext.optim.ExtAmpOptimWrapper` on CPU and CUDA ranks,
    so both run mixed precision through the same code; on CPU ranks with
    ``cpu_amp=False`` (``mmddp_ext_cfg.cpu_amp``) it builds a float32
    ``OptimWrapper`` instead (its AMP-only keys dropped). Other wrappers,
    devices and dtypes run as written.

    Args:
        optim_wrapper (dict | Any): The config's ``optim_wrapper``.
        device (str): ``'cpu'``, ``'cuda'`` or another MMEngine device.
        cpu_amp (bool): Run AMP on CPU ranks. Defaults to True.

    Raises:
        TypeError: ``cpu_amp`` is not a bool.
    """
    from mmengine.optim import AmpOptimWrapper
    from mmengine.registry import OPTIM_WRAPPERS
    if not isinstance(cpu_amp, bool):
        raise TypeError(
            'mmddp_ext_cfg.cpu_amp must be True (AmpOptimWrapper configs '
            'train in mixed precision on CPU ranks too) or False (float32 '
            f'on CPU ranks), but got {cpu_amp!r} ({type(cpu_amp).__name__}).')
    kind = (optim_wrapper.get('type', 'OptimWrapper') if isinstance(
        optim_wrapper, dict) else None)
    cls = OPTIM_WRAPPERS.get(kind) if isinstance(kind, str) else kind
    if not (isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)):
        return Precision(optim_wrapper, False, 'float32', device)
    dtype = optim_wrapper.get('dtype', None)
    name = 'float16' if dtype is None else str(dtype).replace('torch.', '')
    runs_ext = (cls is AmpOptimWrapper and dtype in AMP_DTYPES
                and device in ('cpu', 'cuda'))
    if runs_ext and (device != 'cpu' or cpu_amp):
        built = type(optim_wrapper)(optim_wrapper)
        built['type'] = 'ExtAmpOptimWrapper'
        return Precision(built, True, name, device,
                         'AmpOptimWrapper built as ExtAmpOptimWrapper')
    if device != 'cpu':
        return Precision(optim_wrapper, True, name, device,
                         f'{getattr(cls, "__name__", cls)} as configured')
    plain: Dict[str, Any] = {
        k: v
        for k, v in optim_wrapper.items() if k not in AMP_ONLY_KEYS
    }
    plain['type'] = 'OptimWrapper'
    why = ('mmddp_ext_cfg.cpu_amp=False' if runs_ext else
           f'{getattr(cls, "__name__", cls)} with dtype {dtype!r} runs on '
           'GPUs only; ExtAmpOptimWrapper runs AmpOptimWrapper configs '
           'with dtype float16 or bfloat16 on CPU ranks')
    return Precision(type(optim_wrapper)(plain), False, 'float32', device,
                     f'{why}: AmpOptimWrapper ran as OptimWrapper')
