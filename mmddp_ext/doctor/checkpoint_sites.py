"""Activation-checkpointing sites, as the doctor needs them: named
statically (the model is built, nothing runs), observed while the probe
runs, and switched by ``CheckpointConflictHook``'s policy.

Everything goes through :mod:`mmddp_ext.utils.activation_checkpoint`: its
``watch``/``stop_recording`` record the modules that call checkpointing,
``set_policy`` does what the hook does, ``config_key`` names the
``with_cp`` key of a site.
"""
import contextlib
from typing import Iterator, List, Optional, Sequence

import torch.nn as nn

from ..utils import activation_checkpoint as act_cp

POLICIES_THAT_RESOLVE = ('non_reentrant', 'disable')


def switched_on(model: nn.Module,
                activation_checkpointing: Sequence[str] = ()) -> List[str]:
    """Modules that checkpoint when the model runs, as far as the built
    model shows: the innermost modules whose ``with_cp`` switch is on, and
    the modules MMEngine's ``activation_checkpointing`` setting names."""
    on = [n for n, m in model.named_modules() if getattr(m, 'with_cp', None)]
    innermost = [
        n for n in on
        if not any(o != n and o.startswith(f'{n}.' if n else '') for o in on)
    ]
    listed = [activation_checkpointing] if isinstance(
        activation_checkpointing, str) else list(activation_checkpointing)
    return innermost + [n for n in listed if n not in innermost]


def config_keys(model: nn.Module, names: List[str]) -> List[str]:
    """The ``with_cp`` config keys that switch ``names`` off."""
    keys = set()
    for name in names:
        try:
            keys.add(act_cp.config_key(model, name))
        except AttributeError:  # an activation_checkpointing entry
            continue
    return sorted(k for k in keys if k)


@contextlib.contextmanager
def observed(model: nn.Module) -> Iterator[List[str]]:
    """The list, filled when the block ends, of modules that called
    checkpointing inside it."""
    names: List[str] = []
    act_cp.watch(model)
    try:
        yield names
    finally:
        names.extend(act_cp.stop_recording())


def apply_policy(model: nn.Module, policy: Optional[str]) -> List[str]:
    """Do what ``CheckpointConflictHook`` with ``policy`` does to the
    model's checkpointing once it sees a conflict (the probe applies it
    up front: non-reentrant checkpointing is right with or without one).
    Returns the statically known sites concerned."""
    if policy not in POLICIES_THAT_RESOLVE:
        return []
    act_cp.set_policy(policy)
    return switched_on(model)
