from typing import List, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from torch.nn.parallel import DistributedDataParallel

from ..utils import activation_checkpoint as act_cp

POLICIES = ('non_reentrant', 'disable', 'error')


@HOOKS.register_module()
class CheckpointConflictHook(Hook):
    """Resolve conflicts between activation checkpointing and DDP.

    Reentrant ``torch.utils.checkpoint`` (what ``with_cp=True`` in mmdet's
    ResNet/Swin blocks and DETR encoder checkpointing use) hides the
    checkpointed parameters from DDP's unused-parameter search, so with
    ``find_unused_parameters=True`` their gradients are marked ready twice
    and DDP fails with "Expected to mark a variable ready only once".
    Non-reentrant checkpointing has no such problem and saves the same
    activation memory.

    The hook finds every checkpointing module
    (:func:`mmddp_ext.utils.activation_checkpoint.find_checkpoint_sites`)
    and decides whether the wrapper conflicts with them: a DDP wrapper with
    ``find_unused_parameters=True`` (plain ``MMDistributedDataParallel`` or
    an ``AutoDDP`` decision), or parameters that AutoDDP saw unused inside a
    checkpointed module. With ``AutoDDP`` deciding by itself, the check
    runs after its first (probe) step, before DDP runs a backward. No
    conflict, no change; either way one line is logged.

    ``custom_hooks = [dict(type='CheckpointConflictHook')]``

    Args:
        policy (str): How to resolve a conflict. ``'non_reentrant'`` keeps
            checkpointing and makes it non-reentrant (the memory savings
            stay); ``'disable'`` turns ``with_cp`` off (the classic advice;
            activation memory grows); ``'error'`` stops with a message that
            lists the modules and the config keys to change.
            Defaults to 'non_reentrant'.
    """

    priority = 'VERY_HIGH'

    def __init__(self, policy: str = 'non_reentrant') -> None:
        if not isinstance(policy, str):
            raise TypeError('CheckpointConflictHook: policy must be a str, '
                            f'one of {POLICIES}, but got {policy!r}.')
        if policy not in POLICIES:
            raise ValueError(
                f'CheckpointConflictHook: unknown policy {policy!r}; choose '
                f"one of {POLICIES} (default 'non_reentrant').")
        self.policy = policy
        self._pending = False
        self.resolved: Optional[List[str]] = None

    def before_train(self, runner) -> None:
        model = getattr(runner, 'model', None)
        if model is None:
            print_log(
                'CheckpointConflictHook: the runner has no model; nothing '
                'to check.',
                logger='current')
            return
        if not isinstance(model, DistributedDataParallel) and not hasattr(
                model, 'autoddp_decision'):
            print_log(
                'CheckpointConflictHook: not a DDP run '
                f'({type(model).__name__}); checkpointing left as it is.',
                logger='current')
            return
        if getattr(model, '_ddp_built', True):
            self._check(runner, model)
        else:
            self._pending = True  # AutoDDP decides after its probe step

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        if self._pending and getattr(runner.model, '_ddp_built', False):
            self._pending = False
            self._check(runner, runner.model)

    # ------------------------------------------------------------ internals
    def _conflict_reason(self, model, sites) -> Optional[str]:
        decision = getattr(model, 'autoddp_decision', None) or {}
        if getattr(model, 'find_unused_parameters', False):
            return 'DDP runs with find_unused_parameters=True'
        site_prefixes = tuple(f'{s.name}.' for s in sites)
        doubtful = [
            n for n in decision.get('partially_used', []) +
            decision.get('never_used', []) if n.startswith(site_prefixes)
        ]
        if doubtful:
            return ('parameters inside checkpointed modules went unused: '
                    f"{', '.join(doubtful[:5])}")
        return None

    def _check(self, runner, model) -> None:
        sites = act_cp.find_checkpoint_sites(model.module)
        if not sites:
            print_log(
                'CheckpointConflictHook: no activation checkpointing in the '
                'model; nothing to resolve.',
                logger='current')
            self.resolved = []
            return
        reason = self._conflict_reason(model, sites)
        names = [s.name for s in sites]
        if reason is None:
            print_log(
                f'CheckpointConflictHook: checked {len(sites)} checkpointing '
                'module(s); no conflict with DDP '
                f'(find_unused_parameters=False); left as they are.',
                logger='current')
            self.resolved = []
            return
        if self.policy == 'error':
            keys = sorted({act_cp.config_key(model.module, n) for n in names})
            raise ValueError(
                f'CheckpointConflictHook: reentrant activation checkpointing '
                f'conflicts with DDP ({reason}) in {len(sites)} module(s): '
                f'{_short(names)}. Set {", ".join(k + "=False" for k in keys)}'
                ", or use policy='non_reentrant' to keep the memory savings.")
        changed = []
        for site in sites:
            if self.policy == 'disable' and site.switchable:
                act_cp.disable(site)
                changed.append(site.name)
            elif site.explicit_reentrant and not site.switchable:
                print_log(
                    f'CheckpointConflictHook: {site.name} passes '
                    'use_reentrant itself and has no with_cp switch; '
                    'left unchanged.',
                    logger='current',
                    level=30)
            else:
                act_cp.mark_non_reentrant(site.module)
                changed.append(site.name)
        verb = ('disabled checkpointing in' if self.policy == 'disable' else
                'made checkpointing non-reentrant in')
        print_log(
            f'CheckpointConflictHook: {reason}; {verb} {len(changed)} '
            f'module(s): {_short(changed)}.',
            logger='current')
        self.resolved = changed


def _short(names: List[str], limit: int = 8) -> str:
    shown = ', '.join(names[:limit])
    return shown + (f' (+{len(names) - limit} more)'
                    if len(names) > limit else '')
