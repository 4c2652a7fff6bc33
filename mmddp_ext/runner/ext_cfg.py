"""The ``mmddp_ext_cfg`` rules, read in one place.

The keys' defaults (:data:`EXT_CFG_DEFAULTS`) and their check
(:func:`checked_ext_cfg`), whether a config's runner reads them
(:func:`opted_in`, :func:`ext_cfg_of`), the hooks ``ExtRunner`` registers
for them with their arguments (:func:`ext_hooks`) and the train collate
function they choose (:func:`train_collate_cfg`). ``ExtRunner``, the DDP
doctor, ``tools/train.py`` and
:func:`~mmddp_ext.runner.ddp_setup.resolve_ddp_setup` read them here.

``mmddp_ext_cfg`` takes effect only with ``ExtRunner`` (or a subclass);
a config on another runner resolves as if every key were off.
"""
from typing import Any, Dict, List, Optional, Tuple

from mmengine.registry import RUNNERS

from ..hooks.rank_consistency_hook import refuse_moved_skip_args

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
    refuse_moved_skip_args(
        checks if isinstance(checks, dict) else (), in_ext_cfg=True)
    return ext


def runner_class(cfg) -> Optional[type]:
    """The class ``cfg.runner_type`` names (``Runner`` when unset), looked
    up in the config's ``default_scope``; None when no registry knows it."""
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


def train_collate_cfg(loader_cfg: Optional[dict],
                      ext_cfg: Dict[str, Any]) -> Optional[dict]:
    """The train ``collate_fn`` config in effect; None for the dataloader's
    default (``pseudo_collate``)."""
    collate = (loader_cfg or {}).get('collate_fn')
    guard = ext_cfg.get('empty_gt_guard')
    if collate is None and guard is not None:
        collate = dict(type='empty_gt_guard_collate', **guard)
    return collate
