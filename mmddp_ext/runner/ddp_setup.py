"""The DDP set-up a launch of a config resolves to, decided in one place.

``ExtRunner.wrap_model`` builds its wrapper from :func:`resolve_ddp_setup`,
and the DDP doctor reads the same function to say what a launch on N GPUs
would use. The rules, in order:

- wrapper: ``model_wrapper_cfg`` when the config sets it (a top-level
  ``find_unused_parameters`` is then ignored, as stock MMEngine ignores
  it); else ``AutoDDP`` when ``mmddp_ext_cfg.auto_ddp`` is on, with a
  top-level ``find_unused_parameters`` passed on as the user's explicit
  choice (None lets AutoDDP decide); else stock MMEngine's default,
  ``MMDistributedDataParallel(broadcast_buffers=False,
  find_unused_parameters=bool(find_unused_parameters))``;
- ``sync_bn``: converts the model on a GPU launch; on CPU ranks
  ``ExtRunner`` skips it (torch's ``SyncBatchNorm`` runs on GPUs only);
- activation-checkpointing policy: a ``CheckpointConflictHook`` listed in
  ``custom_hooks`` (its ``policy``) wins over
  ``mmddp_ext_cfg.checkpoint_conflict``;
- train collate function: the dataloader's own ``collate_fn`` wins over
  ``mmddp_ext_cfg.empty_gt_guard``; stock MMEngine's is
  ``pseudo_collate``.

``mmddp_ext_cfg`` takes effect only with ``ExtRunner`` (or a subclass);
a config on another runner resolves as if every key were off.
"""
import copy
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from mmengine.registry import HOOKS, MODEL_WRAPPERS

from ..hooks.checkpoint_conflict_hook import CheckpointConflictHook
from ..hooks.rank_consistency_hook import RankConsistencyHook
from ..wrappers.auto_ddp import AutoDDP

STOCK_WRAPPER = 'MMDistributedDataParallel'
STOCK_COLLATE = dict(type='pseudo_collate')
_FROM_CFG = object()

# mmddp_ext_cfg keys and their values when the key is absent (documented
# in ExtRunner's docstring and docs/design.md).
EXT_CFG_DEFAULTS = dict(
    auto_ddp=False,
    checkpoint_conflict=None,
    empty_gt_guard=None,
    empty_gt_stats=False,
    finite_predictions=True,
    nonfinite_skip=None,
    rank_consistency=None,
)


def checked_ext_cfg(given: Any, defaults: Dict[str, Any]) -> Dict[str, Any]:
    """``mmddp_ext_cfg`` (``given``, None for unset) over ``defaults``.

    Raises:
        TypeError: ``given`` is not a dict.
        ValueError: ``given`` has keys ``defaults`` does not know.
    """
    given = given or {}
    if not isinstance(given, dict):
        raise TypeError('mmddp_ext_cfg must be a dict, but got '
                        f'{type(given).__name__}.')
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f'mmddp_ext_cfg has unknown key(s) {unknown}; accepted keys '
            f'are {sorted(defaults)}.')
    return dict(defaults, **given)


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
    """The ``model_wrapper_cfg`` a distributed launch builds (a copy)."""
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

    def describe(self) -> str:
        flag = ('decided by AutoDDP after its first step'
                if self.find_unused is None else str(self.find_unused))
        return (f'{self.wrapper} (find_unused_parameters: {flag}), runner '
                f'{self.runner_type}, mmddp_ext '
                f'{"on" if self.opted_in else "off"}')


def resolve_ddp_setup(cfg,
                      ext_cfg: Optional[Dict[str, Any]],
                      device: str = 'cuda',
                      model_wrapper_cfg: Any = _FROM_CFG) -> DDPSetup:
    """Resolve ``cfg``'s DDP set-up for a launch on ``device``.

    Args:
        cfg (Config): The config.
        ext_cfg (dict, optional): ``mmddp_ext_cfg`` with its defaults, as
            ``ExtRunner.ext_cfg`` gives it; None when the runner is not an
            ``ExtRunner`` (every key off).
        device (str): ``'cuda'`` for a GPU launch, ``'cpu'`` for CPU ranks.
            Defaults to 'cuda'.
        model_wrapper_cfg (dict, optional): The wrapper config the runner
            got; defaults to ``cfg.model_wrapper_cfg``.
    """
    ext = dict(ext_cfg or {})
    given_wrapper = (cfg.get('model_wrapper_cfg')
                     if model_wrapper_cfg is _FROM_CFG else model_wrapper_cfg)
    resolved = wrapper_cfg(given_wrapper, bool(ext.get('auto_ddp')),
                           cfg.get('find_unused_parameters', None))
    wrapper = resolved['type']
    auto_ddp = _resolves_to(MODEL_WRAPPERS, wrapper, AutoDDP)
    find_unused = resolved.get('find_unused_parameters', None)
    if not auto_ddp:
        find_unused = bool(find_unused)
    sync_bn = cfg.get('sync_bn', None)
    skipped = sync_bn is not None and device == 'cpu'

    listed = listed_hook(cfg, CheckpointConflictHook)
    policy = ext.get('checkpoint_conflict')
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
            ext.get('rank_consistency') is not None
            or listed_hook(cfg, RankConsistencyHook) is not None),
        collate=dict(collate or STOCK_COLLATE))


# Keys only AmpOptimWrapper takes.
AMP_ONLY_KEYS = ('loss_scale', 'dtype', 'use_fsdp')


def cpu_optim_wrapper_cfg(optim_wrapper: Any) -> Any:
    """``optim_wrapper`` with ``AmpOptimWrapper`` (or a subclass) replaced
    by ``OptimWrapper`` (its AMP-only keys dropped); other values as
    they are."""
    from mmengine.optim import AmpOptimWrapper
    from mmengine.registry import OPTIM_WRAPPERS
    if not isinstance(optim_wrapper, dict):
        return optim_wrapper
    kind = optim_wrapper.get('type', 'OptimWrapper')
    cls = OPTIM_WRAPPERS.get(kind) if isinstance(kind, str) else kind
    if not (isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)):
        return optim_wrapper
    plain: Dict[str, Any] = {
        k: v
        for k, v in optim_wrapper.items() if k not in AMP_ONLY_KEYS
    }
    plain['type'] = 'OptimWrapper'
    return type(optim_wrapper)(plain)
