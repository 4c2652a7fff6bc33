"""Activation-checkpointing sites, as the doctor needs them: named
statically (the model is built, nothing runs), observed while the probe
runs, and switched by ``CheckpointConflictHook``'s policy.

Everything goes through :mod:`mmddp_ext.utils.activation_checkpoint`.
Where it observes the checkpoint calls actually made (``watch``), the
probe records those; where it finds sites from the model
(``find_checkpoint_sites``), that list is used.
"""
import contextlib
from typing import Iterator, List

import torch.nn as nn

from ..utils import activation_checkpoint as act_cp

POLICIES_THAT_RESOLVE = ('non_reentrant', 'disable')


def switched_on(model: nn.Module) -> List[str]:
    """Modules that checkpoint when the model runs, as far as the built
    model shows: the utility's own site search, or else the innermost
    modules whose ``with_cp`` switch is on."""
    if hasattr(act_cp, 'find_checkpoint_sites'):
        return [s.name for s in act_cp.find_checkpoint_sites(model)]
    on = [n for n, m in model.named_modules() if getattr(m, 'with_cp', None)]
    return [
        n for n in on
        if not any(o != n and o.startswith(f'{n}.' if n else '') for o in on)
    ]


def config_keys(model: nn.Module, names: List[str]) -> List[str]:
    """The ``with_cp`` config keys that switch ``names`` off."""
    keys = {act_cp.config_key(model, n) for n in names}
    return sorted(k for k in keys if k)


@contextlib.contextmanager
def observed(model: nn.Module) -> Iterator[List[str]]:
    """The list, filled when the block ends, of modules that called
    checkpointing inside it (observed where the utility can)."""
    names: List[str] = []
    if not hasattr(act_cp, 'watch'):
        names.extend(switched_on(model))
        yield names
        return
    act_cp.watch(model)
    try:
        yield names
    finally:
        names.extend(act_cp.stop_recording())


def apply_policy(model: nn.Module, policy) -> List[str]:
    """Do what ``CheckpointConflictHook`` with ``policy`` does to the
    model's checkpointing once it sees a conflict (the probe applies it
    up front: non-reentrant checkpointing is right with or without one).
    Returns the sites concerned."""
    if policy not in POLICIES_THAT_RESOLVE:
        return []
    sites = switched_on(model)
    if hasattr(act_cp, 'set_policy'):
        act_cp.set_policy(policy)
        return sites
    for site in act_cp.find_checkpoint_sites(model):
        if policy == 'disable' and site.switchable:
            act_cp.disable(site)
        elif not site.explicit_reentrant or site.switchable:
            act_cp.mark_non_reentrant(site.module)
    return sites
