"""The DDP set-up a launch of a config resolves to, decided in one place.

The wrapper with its ``device_ids`` (:func:`resolve_ddp_setup`,
:func:`ddp_device_ids`), ``sync_bn``, the activation-checkpointing policy,
the train collate function and the hooks, as :class:`DDPSetup`.
``ExtRunner.wrap_model`` and the DDP doctor read it here; what
``mmddp_ext_cfg`` switches on is :mod:`~mmddp_ext.runner.ext_cfg`'s. The
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
- hooks: those of :func:`~mmddp_ext.runner.ext_cfg.ext_hooks`; one the
  config lists itself (in ``custom_hooks``) runs with the config's
  arguments instead.

A config on a runner other than ``ExtRunner`` (or a subclass) resolves
as if every ``mmddp_ext_cfg`` key were off.
"""
import copy
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch
from mmengine.registry import HOOKS, MODEL_WRAPPERS
from torch.nn.parallel import DistributedDataParallel

from ..hooks.checkpoint_conflict_hook import CheckpointConflictHook
from ..hooks.rank_consistency_hook import RankConsistencyHook
from ..wrappers.auto_ddp import AutoDDP
from .ext_cfg import ext_cfg_of, ext_hooks, train_collate_cfg

STOCK_WRAPPER = 'MMDistributedDataParallel'
STOCK_COLLATE = dict(type='pseudo_collate')
_FROM_CFG = object()


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
