from typing import Dict, List, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS
from torch.nn.parallel import DistributedDataParallel

from ..launch.side_channel import SideChannel
from ..utils import activation_checkpoint as act_cp
from ..utils.text import shorten
from ..wrappers.auto_ddp import AutoDDP

POLICIES = act_cp.POLICIES


@HOOKS.register_module()
class CheckpointConflictHook(Hook):
    """Resolve conflicts between activation checkpointing and DDP.

    Reentrant ``torch.utils.checkpoint`` (torch's default, used by
    ``with_cp=True`` in mmdet's backbones and necks, by
    ``checkpoint_sequential`` and by MMEngine's ``activation_checkpointing``
    setting) hides the checkpointed parameters from DDP's unused-parameter
    search, so with ``find_unused_parameters=True`` their gradients are
    marked ready twice and DDP fails with "Expected to mark a variable
    ready only once". Non-reentrant checkpointing has no such problem and
    saves the same activation memory.

    The hook does not look for checkpointing in the model's code. It wraps
    the checkpoint functions themselves
    (:mod:`mmddp_ext.utils.activation_checkpoint`): while a conflict exists,
    every checkpoint call that does not state ``use_reentrant`` follows
    ``policy``, whichever module makes it and however it imported the
    function. The modules that checkpoint are those seen calling it in the
    first training step's forward (all ranks combined); they are named in
    the log and in the ``'error'`` message.

    A conflict is a DDP wrapper with ``find_unused_parameters=True`` (plain
    ``MMDistributedDataParallel`` or an ``AutoDDP`` decision), or
    parameters that AutoDDP saw unused inside a checkpointing module. A
    wrapper built with ``find_unused_parameters=True`` conflicts from its
    first step, so the policy applies from the start; so does an
    ``AutoDDP`` whose resumed run records that it needs
    ``find_unused_parameters=True`` (DDP is built at ``before_train``, see
    ``AutoDDP.apply_resumed_decision``). With ``AutoDDP`` deciding by
    itself, the check runs after its probe step (which runs without DDP),
    before DDP runs a backward. Where DDP runs the first step,
    the ranks' sites are merged after its forward and before its backward,
    never between iterations: a rank that used other parameters than its
    peers is stuck in that backward (DDP's own error comes at the next
    iteration), and a merge there would turn the error into a hang. One
    line is logged either way; the policy is lifted after the run.

    ``custom_hooks = [dict(type='CheckpointConflictHook')]``

    Args:
        policy (str): How to resolve a conflict. ``'non_reentrant'`` keeps
            checkpointing and makes it non-reentrant (the memory savings
            stay); ``'disable'`` runs the checkpointed functions without
            checkpointing (the classic advice of turning ``with_cp`` off;
            activation memory grows); ``'error'`` stops every rank with a
            message that lists the modules and the config keys to change.
            Checkpoint calls that state ``use_reentrant`` themselves are
            left as they are (a warning names their modules).
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
        self._channel: Optional[SideChannel] = None
        self._first_forward = None  # the forward hook's handle
        self._reason: Optional[str] = None
        # Checkpointing modules seen in the first step and what their calls
        # stated as use_reentrant (None: not stated); set by the check.
        self.sites: Optional[Dict[str, set]] = None
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
        if isinstance(model, AutoDDP):
            # A resumed or restarted run may already know that it needs
            # find_unused_parameters=True: DDP then runs the first step,
            # and the conflict must be resolved before it.
            model.apply_resumed_decision()
        act_cp.watch(model.module)
        self._channel = SideChannel.open('CheckpointConflictHook')
        if not getattr(model, 'ddp_built', True):
            # AutoDDP probes the first step without DDP: the check runs
            # after it, before DDP runs a backward.
            self._pending = True
            return
        # DDP runs the first step. The sites are merged once its forward
        # has run, before its backward: after the backward a rank that
        # used other parameters than its peers waits in the backward for
        # a bucket all-reduce the peers never launch, so a merge there
        # would hang every rank instead of letting DDP report the error
        # at the next iteration.
        self._first_forward = model.module.register_forward_hook(
            lambda module, args, output: self._after_first_forward(runner))
        if getattr(model, 'find_unused_parameters', False):
            # The first backward already runs under DDP.
            self._apply(runner, 'DDP runs with find_unused_parameters=True')

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        # AutoDDP builds DDP after its probe step.
        if self._pending and getattr(runner.model, 'ddp_built', True):
            self._pending = False
            self._check(runner, runner.model)

    def _after_first_forward(self, runner) -> None:
        self._first_forward.remove()
        self._first_forward = None
        self._check(runner, runner.model)

    def after_run(self, runner) -> None:
        if self._first_forward is not None:  # no training step ran
            self._first_forward.remove()
            self._first_forward = None
        act_cp.reset()

    # ------------------------------------------------------------ internals
    def _apply(self, runner, reason: str) -> None:
        self._reason = reason
        act_cp.set_policy(
            self.policy,
            refuse=lambda site: ValueError(
                self._refusal(runner, [site] if site is not None else [])))

    def _conflict_reason(self, model, sites) -> Optional[str]:
        if getattr(model, 'find_unused_parameters', False):
            return 'DDP runs with find_unused_parameters=True'
        decision = getattr(model, 'autoddp_decision', None) or {}
        prefixes = tuple(f'{name}.' if name else '' for name in sites)
        doubtful = [
            n for n in decision.get('partially_used', []) +
            decision.get('never_used', [])
            if prefixes and n.startswith(prefixes)
        ]
        if doubtful:
            return ('parameters inside checkpointing modules went unused: '
                    f"{', '.join(doubtful[:5])}")
        return None

    def _check(self, runner, model) -> None:
        self.sites = act_cp.merge_records(
            self._channel.all_gather_object(act_cp.stop_recording()))
        reason = self._conflict_reason(model, self.sites)
        if reason is None:
            act_cp.set_policy(None)
            print_log(
                f'CheckpointConflictHook: checked {len(self.sites)} '
                'checkpointing module(s) (those that ran in the first step); '
                'no conflict with DDP (find_unused_parameters=False); left '
                'as they are.',
                logger='current')
            self.resolved = []
            return
        if not self.sites:
            print_log(
                f'CheckpointConflictHook: {reason}, but no activation '
                'checkpointing ran in the first step; nothing to resolve '
                f"(policy '{self.policy}' stays on for later calls).",
                logger='current')
            self._apply(runner, reason)
            self.resolved = []
            return
        if self.policy == 'error':
            self._reason = reason
            raise ValueError(self._refusal(runner, list(self.sites)))
        self._apply(runner, reason)
        stated_reentrant = [
            name for name, stated in self.sites.items()
            if None not in stated and True in stated
        ]
        if stated_reentrant:
            print_log(
                'CheckpointConflictHook: these modules pass '
                'use_reentrant=True to checkpoint themselves and are left '
                'unchanged; DDP may fail in their backward: '
                f'{shorten(stated_reentrant)}.',
                logger='current',
                level=30)
        self.resolved = [
            name for name, stated in self.sites.items() if None in stated
        ]
        verb = ('disabled checkpointing in' if self.policy == 'disable' else
                'made checkpointing non-reentrant in')
        print_log(
            f'CheckpointConflictHook: {reason}; {verb} '
            f'{len(self.resolved)} module(s): {shorten(self.resolved)}.',
            logger='current')

    def _refusal(self, runner, sites: List[str]) -> str:
        """The 'error' message: what conflicts, where, and what to set."""
        model = runner.model.module
        listed = getattr(runner, 'cfg', None) or {}
        listed = listed.get('activation_checkpointing', None) or []
        listed = [listed] if isinstance(listed, str) else list(listed)
        fixes = []
        for site in sites:
            key = act_cp.config_key(model, site)
            if site in listed:
                fix = f"activation_checkpointing without '{site}'"
            elif key is not None:
                fix = f'{key}=False'
            else:
                fix = f'use_reentrant=False in the checkpoint call of {site}'
            if fix not in fixes:
                fixes.append(fix)
        where = shorten([s or '(model root)' for s in sites]) or \
            '(a module outside the model)'
        return (
            f'CheckpointConflictHook: reentrant activation checkpointing '
            f'conflicts with DDP ({self._reason}) in {len(sites)} '
            f'module(s): {where}. Set {", ".join(fixes) or "with_cp=False"}'
            ", or use policy='non_reentrant' to keep the memory savings.")
