"""What a launch of a config would use for DDP: runner, wrapper, hooks,
collate function; the fixes of mmddp_ext count only where the config
switches them on."""
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from mmengine.registry import HOOKS, MODEL_WRAPPERS, RUNNERS

STOCK_WRAPPER = 'MMDistributedDataParallel'
STOCK_COLLATE = dict(type='pseudo_collate')


@dataclass
class DDPSetup:
    """The DDP-relevant settings a launch of the config resolves to.

    Args:
        runner_type (str): The runner class name ('Runner' when unset).
        opted_in (bool): The runner is ``ExtRunner`` (or a subclass), so
            ``mmddp_ext_cfg`` takes effect.
        ext_cfg (dict): ``mmddp_ext_cfg`` with ``ExtRunner``'s defaults;
            all off when not opted in.
        wrapper (str): Model wrapper type name.
        auto_ddp (bool): The wrapper is ``AutoDDP`` (or a subclass).
        find_unused (bool | None): ``find_unused_parameters`` as the wrapper
            gets it; None lets AutoDDP decide after its probe step.
        checkpoint_policy (str | None): ``CheckpointConflictHook`` policy,
            or None without that hook.
        rank_consistency (bool): ``RankConsistencyHook`` is on.
        collate (dict): The train ``collate_fn`` config in effect.
    """
    runner_type: str
    opted_in: bool
    ext_cfg: Dict[str, Any]
    wrapper: str
    auto_ddp: bool
    find_unused: Optional[bool]
    checkpoint_policy: Optional[str]
    rank_consistency: bool
    collate: Dict[str, Any] = field(default_factory=dict)

    def describe(self) -> str:
        flag = ('decided by AutoDDP after its first step'
                if self.find_unused is None else str(self.find_unused))
        return (f'{self.wrapper} (find_unused_parameters: {flag}), runner '
                f'{self.runner_type}, mmddp_ext '
                f'{"on" if self.opted_in else "off"}')


def _is_subclass(registry, type_name: Any, base_name: str) -> bool:
    """Whether ``type_name`` resolves in ``registry`` to a class whose MRO
    contains a class called ``base_name``."""
    cls = registry.get(type_name) if isinstance(type_name, str) else type_name
    return isinstance(cls, type) and any(
        klass.__name__ == base_name for klass in cls.__mro__)


def _hook_cfg(cfg, base_name: str) -> Optional[dict]:
    for hook in cfg.get('custom_hooks') or []:
        if isinstance(hook, dict) and _is_subclass(HOOKS, hook.get('type'),
                                                   base_name):
            return dict(hook)
    return None


def ext_cfg_defaults() -> Dict[str, Any]:
    from ..runner.ext_runner import EXT_CFG_DEFAULTS
    return dict(EXT_CFG_DEFAULTS)


def resolve_setup(cfg) -> DDPSetup:
    """Work out what ``Runner``/``ExtRunner`` would build for ``cfg``.

    Mirrors ``ExtRunner.wrap_model``/``register_hooks`` and its collate
    rule, and stock ``Runner.wrap_model`` when the runner is not
    ``ExtRunner``.
    """
    runner_type = cfg.get('runner_type') or 'Runner'
    opted_in = _is_subclass(RUNNERS, runner_type, 'ExtRunner')
    ext = ext_cfg_defaults()
    if opted_in:
        ext.update(cfg.get('mmddp_ext_cfg') or {})
    else:  # stock Runner: even the keys on by default (finite_predictions)
        ext = {
            key: False if isinstance(value, bool) else None
            for key, value in ext.items()
        }
    wrapper_cfg = cfg.get('model_wrapper_cfg')
    top_flag = cfg.get('find_unused_parameters', None)
    if wrapper_cfg is None and ext['auto_ddp']:
        wrapper, find_unused = 'AutoDDP', top_flag
    elif wrapper_cfg is None:
        wrapper, find_unused = STOCK_WRAPPER, bool(top_flag)
    else:
        wrapper = wrapper_cfg.get('type', STOCK_WRAPPER)
        find_unused = wrapper_cfg.get('find_unused_parameters', None)
    auto_ddp = _is_subclass(MODEL_WRAPPERS, wrapper, 'AutoDDP')
    if not auto_ddp:
        find_unused = bool(find_unused)
    if not isinstance(wrapper, str):
        wrapper = getattr(wrapper, '__name__', str(wrapper))

    cp_hook = _hook_cfg(cfg, 'CheckpointConflictHook')
    policy = ext['checkpoint_conflict']
    if cp_hook is not None:
        policy = cp_hook.get('policy', 'non_reentrant')
    rank_consistency = (ext['rank_consistency'] is not None
                        or _hook_cfg(cfg, 'RankConsistencyHook') is not None)
    loader = cfg.get('train_dataloader') or {}
    collate = loader.get('collate_fn')
    if collate is None and ext['empty_gt_guard'] is not None:
        collate = dict(type='empty_gt_guard_collate', **ext['empty_gt_guard'])
    return DDPSetup(
        runner_type=str(runner_type),
        opted_in=opted_in,
        ext_cfg=ext,
        wrapper=wrapper,
        auto_ddp=auto_ddp,
        find_unused=find_unused,
        checkpoint_policy=policy,
        rank_consistency=rank_consistency,
        collate=dict(collate or STOCK_COLLATE))
