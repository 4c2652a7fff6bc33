import logging
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub, print_log
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS

from ..launch.side_channel import SideChannel
from ..utils.ddp_averaging import average_gradients, broadcast_from_rank0
from ..utils.text import group_param_names, ranks_text
from ..utils.torch_private import (ignore_in_ddp, queue_end_of_backward,
                                   reducer_params)

# The decision is kept in the message hub under this key, so every
# checkpoint carries it and ``--resume`` restores it.
DECISION_INFO_KEY = 'autoddp'
# A left-out parameter that receives gradients again is logged the first
# time, then once per this many iterations in which it does.
WOKE_LOG_EVERY = 100

NamedParams = List[Tuple[str, nn.Parameter]]


def ddp_ignore_names(module: nn.Module,
                     params: Sequence[nn.Parameter]) -> List[str]:
    """Every name under which DDP looks ``params`` up in its ignore list.

    DDP builds its reducer's parameter list from ``named_modules()`` and
    each module's own parameters, keyed ``f'{module_name}.{param_name}'``
    (``'.extra'`` for a parameter on the root, one key per module for a
    shared parameter), but skips broadcasting by the keys of
    ``named_parameters()`` (``'extra'``). Both sets are returned, found by
    identity, so that the parameters are left out of both.
    """
    wanted = {id(p) for p in params}
    names = {n for n, p in module.named_parameters() if id(p) in wanted}
    for module_name, sub in module.named_modules():
        for param_name, param in sub.named_parameters(recurse=False):
            if id(param) in wanted:
                names.add(f'{module_name}.{param_name}')
    return sorted(names)


class UnexpectedUnusedParameterError(RuntimeError):
    """A parameter went unused on the fast path, where DDP would hang.

    Raised on every rank with the same message. ``need`` is the decision
    to keep for a restart (``find_unused_parameters=True`` and why).
    """

    def __init__(self, message: str, need: Optional[dict] = None):
        super().__init__(message)
        self.need = need


class IgnoredParameterLeakError(RuntimeError):
    """DDP's reducer still holds a parameter AutoDDP left out of DDP."""


@MODEL_WRAPPERS.register_module()
class AutoDDP(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that works out ``find_unused_parameters``.

    ``model_wrapper_cfg = dict(type='AutoDDP')``. With the flag left unset,
    the first optimizer step is a probe: the model runs without DDP,
    gradients are averaged across ranks by one flat all-reduce (with DDP's
    semantics: a parameter used on some rank gets the average with zeros
    from the others; one used on no rank keeps ``grad is None``), and the
    ranks combine which trainable parameters each backward used (recorded
    by post-accumulate-grad hooks, so with gradient accumulation every
    micro-step counts). DDP is then built in the cheapest correct mode and
    one line is logged:

    - every parameter used in every backward on every rank:
      ``find_unused_parameters=False``, exactly DDP's fast path;
    - some parameters used in no backward on any rank (a layer added to a
      head but not wired into the loss): those are excluded from DDP
      (``_ddp_params_and_buffers_to_ignore``, under every name DDP looks
      them up by) and the rest runs on the fast path, with no
      per-iteration graph traversal. After building DDP, AutoDDP checks
      that its reducer holds none of them. Should an excluded parameter
      receive a gradient later, its gradient is averaged across ranks on
      the spot, so replicas never diverge (logged the first time, then
      every ``WOKE_LOG_EVERY`` such iterations);
    - some parameters used on some ranks or in some micro-steps only:
      ``find_unused_parameters=True``.

    On the fast path, a parameter that goes unused later on some rank would
    make DDP hang or fail with "Expected to have finished reduction". At
    the end of every synchronising backward, before DDP finalises, the
    ranks compare which parameters went unused over a side channel (a gloo
    group of its own, or the store: never the default group, where DDP's
    bucket all-reduces may be pending), and every rank raises the same
    :class:`UnexpectedUnusedParameterError` naming the ranks, the
    parameters and the config to set.

    The decision is kept in :attr:`autoddp_decision` (read by
    ``CheckpointConflictHook``) and in the message hub, so checkpoints
    carry it. A run resumed from a checkpoint that records a need for
    ``find_unused_parameters=True`` (or restarted in a work dir that
    records it, see :mod:`~mmddp_ext.wrappers.auto_ddp_restart`) builds DDP
    that way without probing, before its first step
    (:meth:`apply_resumed_decision`).

    Args:
        module (nn.Module): Model to wrap.
        find_unused_parameters (bool, optional): ``None`` (default) lets
            AutoDDP decide. ``True``/``False`` are honoured as given, and one
            line is logged if the first step shows a different need.
        detect_anomalous_params (bool): As in ``MMDistributedDataParallel``.
            Defaults to False.
        **kwargs: Other ``DistributedDataParallel`` arguments, unchanged
            (``ExtRunner`` passes ``device_ids`` as
            :func:`~mmddp_ext.runner.ddp_setup.resolve_ddp_setup` rules:
            None on CPU ranks).
    """

    woke_log_every = WOKE_LOG_EVERY

    def __init__(self,
                 module: nn.Module,
                 find_unused_parameters: Optional[bool] = None,
                 detect_anomalous_params: bool = False,
                 **kwargs):
        if find_unused_parameters not in (None, True, False):
            raise TypeError(
                'AutoDDP: find_unused_parameters must be None (decide '
                'automatically), True or False, but got '
                f'{find_unused_parameters!r}.')
        if find_unused_parameters is None:
            # DDP is built after the probe step; until then this object is a
            # plain module holding the model (val/test steps work as usual).
            nn.Module.__init__(self)
            self.module = module
        else:
            super().__init__(
                module,
                detect_anomalous_params=detect_anomalous_params,
                find_unused_parameters=find_unused_parameters,
                **kwargs)
        self._ddp_built = find_unused_parameters is not None
        self.detect_anomalous_params = detect_anomalous_params
        self._ddp_kwargs = kwargs
        self._user_flag = find_unused_parameters
        self._ignored: NamedParams = []
        # Parameters that must be used in every synchronising backward.
        self._checked: NamedParams = (
            self._trainable() if find_unused_parameters is False else [])
        self._side: Optional[SideChannel] = None
        if self._checked:
            self._side = SideChannel.open('AutoDDP')
        self._observe_first_step = find_unused_parameters is not None
        self._local_unused: List[str] = []
        self._probe_started = False
        self._probe_always: Optional[List[bool]] = None
        self._probe_ever: Optional[List[bool]] = None
        self._woke_events = 0
        self.autoddp_decision: Optional[dict] = None
        # The runner resumes after building the wrapper, so a decision
        # already in the message hub comes from an earlier run in this
        # process (a second Runner, a test), not from this run's checkpoint.
        MessageHub.get_current_instance().pop_info(DECISION_INFO_KEY, None)
        # ids of the parameters whose gradient the running backward
        # accumulated; a plain set (not ``self``) in the hooks, so that
        # deep copies of the model (EMA) do not drag the wrapper along.
        self._used_now: Set[int] = set()
        used = self._used_now
        for _, param in self._trainable():
            param.register_post_accumulate_grad_hook(lambda p: used.add(id(p)))

    # ------------------------------------------------------------------ api
    @property
    def ddp_built(self) -> bool:
        """Whether DDP runs the training steps yet: False until AutoDDP has
        decided (during its probe step the model runs without DDP), True
        from then on, and from the start with a given
        ``find_unused_parameters`` or a resumed decision."""
        return self._ddp_built

    def forward(self, *inputs, **kwargs):
        """Before DDP is built (the probe step), call the model directly,
        so that hooks registered on this wrapper run in every step."""
        if not self._ddp_built:
            return self.module(*inputs, **kwargs)
        return super().forward(*inputs, **kwargs)

    def train_step(self, data: Union[dict, tuple, list],
                   optim_wrapper: OptimWrapper) -> Dict[str, torch.Tensor]:
        """Differs from ``MMDistributedDataParallel.train_step`` in running
        the first step as a probe (no DDP yet) when the flag is unset, and in
        hooking the loss so that a check runs at the end of its backward."""
        self.apply_resumed_decision()
        probing = not self._ddp_built
        if probing and not self._probe_started:
            self._probe_started = True
            self._broadcast_module_states()
        # no_sync exists only once DDP is built.
        with optim_wrapper.optim_context(self.module if probing else self):
            data = self.module.data_preprocessor(data, training=True)
            losses = self._run_forward(data, mode='loss')
        parsed_loss, log_vars = self.module.parse_losses(losses)
        syncs = getattr(optim_wrapper, 'should_sync', lambda: True)()
        if parsed_loss.requires_grad:
            if probing:
                self._watch_backward(parsed_loss,
                                     lambda: self._after_probe_backward(syncs))
            elif syncs:
                self._watch_backward(parsed_loss, self._check_usage)
        optim_wrapper.update_params(parsed_loss)
        if self.detect_anomalous_params and not probing:
            from mmengine.model.utils import detect_anomalous_params
            detect_anomalous_params(parsed_loss, model=self)
        if probing and syncs:
            self._build_ddp()
        elif self._observe_first_step and syncs:
            self._report_observation()
        return log_vars

    # ------------------------------------------------------------ internals
    def _watch_backward(self, loss: torch.Tensor, callback: Callable) -> None:
        """Record which parameters the backward of ``loss`` uses and queue
        ``callback`` for its end.

        The hook on the loss fires first in its backward: it clears the
        record, and the callback it queues runs before DDP's own
        finalisation (queued later, by the first gradient bucket).
        """
        used = self._used_now

        def at_start(grad):
            used.clear()
            queue_end_of_backward(callback)
            return grad

        loss.register_hook(at_start)

    def _used_in_backward(self, params: NamedParams) -> List[bool]:
        """For each parameter, whether the last backward accumulated a
        gradient into it."""
        return [id(p) in self._used_now for _, p in params]

    def _trainable(self) -> NamedParams:
        return [(n, p) for n, p in self.module.named_parameters()
                if p.requires_grad]

    def _broadcast_module_states(self) -> None:
        """Start from rank 0's weights, as ``DistributedDataParallel``'s
        constructor does (the probe runs before it)."""
        broadcast_from_rank0(self.module)

    def _average_grads(self, params: List[nn.Parameter]) -> None:
        """Average ``params``' gradients across ranks like DDP: missing ones
        count as zeros, each is divided by the world size before the sum."""
        average_gradients(params)

    # ---------------------------------------------------------------- probe
    def _after_probe_backward(self, syncs: bool) -> None:
        self._record_probe_usage(self._used_in_backward(self._trainable()))
        if syncs:
            self._probe_sync()

    def _record_probe_usage(self, used: List[bool]) -> None:
        """A parameter counts as always used only if every backward of the
        probe (every micro-step) used it."""
        if self._probe_always is None:
            self._probe_always, self._probe_ever = list(used), list(used)
            return
        self._probe_always = [
            a and u for a, u in zip(self._probe_always, used)
        ]
        self._probe_ever = [e or u for e, u in zip(self._probe_ever, used)]

    def _probe_sync(self) -> None:
        """Count, per parameter, the ranks that used it in every micro-step
        and the ranks that used it at all; average the used gradients."""
        trainable = self._trainable()
        device = trainable[0][1].device
        counts = torch.tensor([self._probe_always, self._probe_ever],
                              dtype=torch.int32,
                              device=device)
        dist.all_reduce(counts)
        self._probe_counts = counts.tolist()
        always, ever = self._probe_counts
        self._average_grads([p for (_, p), c in zip(trainable, ever) if c])

    def _build_ddp(self) -> None:
        trainable = self._trainable()
        world_size = dist.get_world_size()
        always, ever = self._probe_counts
        never = [n for (n, _), e in zip(trainable, ever) if e == 0]
        partial = [
            n for (n, _), a, e in zip(trainable, always, ever)
            if e > 0 and a < world_size
        ]
        if partial:
            mode, find_unused = 'find_unused', True
            why = (f'{len(partial)} parameter(s) received gradients on some '
                   f'ranks or in some micro-steps only: '
                   f'{group_param_names(partial)}')
        elif never:
            mode, find_unused = 'ignore_unused', False
            never_set = set(never)
            self._ignored = [(n, p) for n, p in trainable if n in never_set]
            self._leave_out_of_ddp([p for _, p in self._ignored])
            why = (f'{len(never)} parameter(s) received no gradient on any '
                   f'rank and are left out of DDP (their grad stays None; '
                   f'synced on the spot if one is ever used): '
                   f'{group_param_names(never)}')
        else:
            mode, find_unused = 'static', False
            why = 'every trainable parameter received a gradient on every rank'
        self._init_ddp(find_unused)
        if mode == 'ignore_unused':
            self._check_left_out()
        if not find_unused:
            ignored_ids = {id(p) for _, p in self._ignored}
            self._checked = [(n, p) for n, p in trainable
                             if id(p) not in ignored_ids]
            self._side = SideChannel.open('AutoDDP')
        self._decide(
            dict(
                mode=mode,
                find_unused_parameters=find_unused,
                ignored=list(never) if mode == 'ignore_unused' else [],
                partially_used=partial,
                never_used=never,
                reason=why))

    def _decide(self, decision: dict) -> None:
        """Keep the decision (wrapper, message hub) and log it."""
        self.autoddp_decision = decision
        MessageHub.get_current_instance().update_info(DECISION_INFO_KEY,
                                                      dict(decision))
        print_log(
            'AutoDDP: find_unused_parameters='
            f"{decision['find_unused_parameters']} ({decision['mode']}): "
            f"{decision['reason']}.",
            logger='current')

    def apply_resumed_decision(self) -> bool:
        """Build DDP with ``find_unused_parameters=True`` now if the message
        hub records that this run needs it (a resumed checkpoint, or
        ``ExtRunner`` from the work dir's record after a restart).

        Call it once the run has loaded its checkpoint and before its first
        step (``ExtRunner.load_or_resume`` does, and
        ``CheckpointConflictHook`` at ``before_train``), so that hooks see
        DDP as the first step will run it; ``train_step`` calls it too.
        Does nothing once DDP is built or probing has begun.

        Returns:
            bool: Whether DDP was built now.
        """
        if self._ddp_built or self._probe_started:
            return False
        hub = MessageHub.get_current_instance()
        kept = hub.get_info(DECISION_INFO_KEY) or {}
        if not kept.get('find_unused_parameters'):
            return False
        self._init_ddp(True)
        stored = dict(kept)
        source = stored.pop('recorded_in', None) or 'the resumed checkpoint'
        # What the run first found, kept as it is through later resumes.
        found = stored.get('found') or f"{kept.get('mode')}: " \
            f"{kept.get('reason')}"
        self._decide(
            dict(
                stored,
                mode='resumed',
                find_unused_parameters=True,
                ignored=[],
                found=found,
                reason=f'{source} records that this run needs it ({found})'))
        return True

    def _leave_out_of_ddp(self, params: List[nn.Parameter]) -> None:
        module = self.module
        already = getattr(module, '_ddp_params_and_buffers_to_ignore', ())
        names = set(ddp_ignore_names(module, params)) | set(already)
        ignore_in_ddp(module, sorted(names))

    def _check_left_out(self) -> None:
        """Fail at once if DDP's reducer still holds a left-out parameter:
        DDP would skip its broadcast but wait for its gradient, and every
        rank would fail two iterations later with "Expected to have
        finished reduction"."""
        held = {id(p) for p in reducer_params(self)}
        leaked = [n for n, p in self._ignored if id(p) in held]
        if leaked:
            raise IgnoredParameterLeakError(
                f'AutoDDP: {group_param_names(leaked)} received no gradient '
                'in the probe step and were to be left out of DDP, but '
                "DDP's reducer still holds them (the names in "
                '_ddp_params_and_buffers_to_ignore did not match the keys '
                'DDP uses); training would fail with "Expected to have '
                'finished reduction". Set model_wrapper_cfg=dict('
                "type='AutoDDP', find_unused_parameters=True) to train this "
                'model, and report the model layout to mmddp_ext.')

    def _init_ddp(self, find_unused: bool) -> None:
        """Run ``DistributedDataParallel.__init__`` on this live wrapper.

        It starts with ``nn.Module.__init__``, which resets the hooks and
        flags that may already be registered on ``runner.model``; every
        attribute ``nn.Module.__init__`` sets is restored afterwards (hook
        dicts keep their identity, so existing handles still remove them).
        """
        before = dict(self.__dict__)
        super().__init__(
            self.module,
            detect_anomalous_params=self.detect_anomalous_params,
            find_unused_parameters=find_unused,
            **self._ddp_kwargs)
        for key in vars(nn.Module()):
            if key not in before:
                continue
            kept, fresh = before[key], self.__dict__[key]
            if isinstance(kept, dict):
                kept.update(fresh)
            elif isinstance(kept, set):
                kept.update(fresh)
            self.__dict__[key] = kept
        self._ddp_built = True

    # ------------------------------------------------------------ fast path
    def _check_usage(self) -> None:
        """End-of-backward check on the fast path (synchronising backwards
        only).

        Runs before DDP finalises the backward. A checked parameter that
        this backward did not use means DDP's buckets cannot complete on
        that rank: the ranks learn of it over the side channel and all
        raise the same error rather than leave the others waiting. Left-out
        parameters that did get a gradient somewhere are averaged now.
        """
        if not self.require_backward_grad_sync:
            return
        used = self._used_in_backward(self._checked)
        missing = [n for (n, _), u in zip(self._checked, used) if not u]
        if self._observe_first_step:
            trainable = self._trainable()
            used_all = self._used_in_backward(trainable)
            self._local_unused = [
                n for (n, _), u in zip(trainable, used_all) if not u
            ]
            if self._user_flag:
                return
        woke_here = [int(p.grad is not None) for _, p in self._ignored]
        totals = [len(missing)] + woke_here
        if self._side is not None:
            totals = self._side.sum_ints(totals)
        if totals[0]:
            reports = ([missing] if self._side is None else
                       self._side.all_gather_object(missing))
            raise self._unused_error(reports)
        woke = [(n, p) for (n, p), c in zip(self._ignored, totals[1:]) if c]
        if woke:
            self._average_grads([p for _, p in woke])
            self._log_woke([n for n, _ in woke])

    def _unused_error(
            self, reports: List[List[str]]) -> UnexpectedUnusedParameterError:
        """The same error on every rank, from every rank's unused list
        (``reports[r]``; one entry without a side channel)."""
        if len(reports) == 1:
            reports_by_rank = {dist.get_rank(): reports[0]}
        else:
            reports_by_rank = dict(enumerate(reports))
        ranks = [r for r, names in reports_by_rank.items() if names]
        lists = {tuple(reports_by_rank[r]) for r in ranks}
        if len(lists) == 1:
            names = list(lists.pop())
            where = group_param_names(names)
        else:
            names = sorted({n for r in ranks for n in reports_by_rank[r]})
            where = '; '.join(
                f'rank {r}: {group_param_names(reports_by_rank[r])}'
                for r in ranks)
        why = (f'{len(names)} parameter(s) went unused on '
               f'{ranks_text(ranks)} after the probe step: '
               f'{group_param_names(names)}')
        need = dict(
            mode='needs_find_unused',
            find_unused_parameters=True,
            ignored=[],
            partially_used=names,
            never_used=[],
            reason=why)
        return UnexpectedUnusedParameterError(
            f'AutoDDP ({ranks_text(ranks)}): {len(names)} parameter(s) '
            'received no gradient in this iteration, but DDP runs with '
            'find_unused_parameters=False, where every parameter must be '
            f'used on every rank: {where}. Every rank stops here. '
            "Set model_wrapper_cfg=dict(type='AutoDDP', "
            'find_unused_parameters=True) in the config to train with '
            'parameters that are used only on some iterations or ranks '
            '(a run restarted by torchrun resumes that way by itself).',
            need=need)

    def _log_woke(self, names: List[str]) -> None:
        self._woke_events += 1
        every = self.woke_log_every
        if self._woke_events != 1 and self._woke_events % every:
            return
        print_log(
            'AutoDDP: parameters left out of DDP received gradients and '
            'were averaged across ranks: '
            f'{group_param_names(names)} ({self._woke_events} iteration(s) '
            f'so far; logged again every {every} such '
            'iterations).',
            logger='current',
            level=logging.WARNING)

    def _report_observation(self) -> None:
        """With a user-set flag: compare it with what the first step
        needed and log one line if they disagree."""
        self._observe_first_step = False
        trainable = self._trainable()
        local = set(self._local_unused)
        device = trainable[0][1].device if trainable else 'cpu'
        unused = torch.tensor([n in local for n, _ in trainable],
                              dtype=torch.int32,
                              device=device)
        dist.all_reduce(unused)
        unused_names = [
            n for (n, _), c in zip(trainable, unused.tolist()) if c
        ]
        if self._user_flag and not unused_names:
            print_log(
                'AutoDDP: find_unused_parameters=True was set, but every '
                'trainable parameter received a gradient on every rank in '
                'the first step; leaving it unset would run the faster '
                'find_unused_parameters=False path.',
                logger='current',
                level=logging.WARNING)
        self.autoddp_decision = dict(
            mode='user',
            find_unused_parameters=bool(self._user_flag),
            ignored=[],
            partially_used=[],
            never_used=unused_names,
            reason='set in model_wrapper_cfg')
