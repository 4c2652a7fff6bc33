"""Fail fast on diverging DDP ranks; skip non-finite steps together."""
import logging
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch
import torch.distributed as dist
from mmengine.dist import get_comm_device
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict
from mmengine.registry import HOOKS
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from ..utils.side_channel import SideChannel
from ..utils.text import ranks_text
from .rank_fingerprint import (COMPARED_FIELDS, FINGERPRINT_FIELDS, UNKNOWN,
                               RankDivergenceError, collective_count,
                               describe_divergence, gt_boxes_in, keys_text,
                               loss_keys_hash)

SKIPS_SCALAR = 'train/nonfinite_skips'


class NonFiniteLossError(RuntimeError):
    """The loss stayed non-finite for too many iterations in a row; raised
    on every rank with the same message."""


@HOOKS.register_module()
class RankConsistencyHook(Hook):
    """Fail fast, with one clear error, when DDP ranks diverge, and skip
    optimizer steps with a non-finite loss on every rank together.

    ``custom_hooks = [dict(type='RankConsistencyHook')]`` (``ExtRunner``
    registers it when ``mmddp_ext_cfg.rank_consistency`` is a dict).

    The hook needs no stage between forward and backward of its own: at
    ``before_train`` it wraps the model's ``parse_losses``, which both
    ``MMDistributedDataParallel.train_step`` and ``AutoDDP.train_step``
    call after the forward and before ``optim_wrapper.update_params``, and
    the optimizer wrapper's ``step``. Both are restored at ``after_train``.

    It is a hook rather than part of ``AutoDDP`` so that it works with any
    wrapper whose ``train_step`` calls ``parse_losses`` (stock
    ``MMDistributedDataParallel`` included) and without one.

    **Consistency check** (the first ``check_first`` iterations of the run,
    and after them every iteration whose number, as the log counts it, is
    a multiple of ``check_every``). Each rank builds a fingerprint of
    six integers: the iteration, a hash and the number of its loss keys,
    the collectives its forward issued on the default process group this
    iteration (torch's sequence number), its number of trainable
    parameters, and its batch's GT boxes. The fingerprints are
    all-gathered before the backward; if any field but the GT count
    differs, the ranks gather their loss keys and every rank raises
    :class:`RankDivergenceError` with the same message, e.g. "rank 1 has
    extra loss key(s) loss_aux ...". The check runs on a side channel
    (:class:`~mmddp_ext.utils.side_channel.SideChannel`: a gloo group of
    its own, created at ``before_train`` with the default group's timeout,
    or, where gloo cannot connect across nodes, the default group's store,
    with one warning naming ``GLOO_SOCKET_IFNAME``), so it never pairs
    with a collective of the model: a rank whose forward launched an extra
    NCCL collective still reaches the check, and the difference is
    reported instead of a hang. (With gloo a collective
    blocks the host, so a rank stuck in an extra one does not reach the
    check; the collective timeout ends that run.)

    **Non-finite losses** (every iteration, unless ``skip_nonfinite`` is
    False). Each rank marks its slot in a world-size vector when its total
    loss (``parse_losses``' sum of the ``loss`` terms) is NaN/inf; one
    all-reduce of that vector on the default group (on the GPU with NCCL,
    launched before the backward and waited for at the step, so nothing
    stalls in between) gives every rank the same answer. The backward still
    runs everywhere, so DDP's collectives stay matched; if any rank was
    non-finite, every rank then skips ``optimizer.step`` (and gradient
    clipping) and the gradients are zeroed by ``update_params`` as usual,
    so the replicas stay identical.
    Rank 0 logs a warning naming the ranks and their non-finite loss keys,
    the count goes to the message hub as ``train/nonfinite_skips`` (in
    every log line), and the non-finite values are left out of the logged
    losses (they would show ``nan`` for a whole smoothing window). After
    ``max_consecutive_skips`` skipped steps in a row every rank raises
    :class:`NonFiniteLossError`. Buffers updated in the forward (BatchNorm
    running statistics, NaN after a NaN input) are restored on the
    offending ranks from the lowest healthy rank by one broadcast per
    buffer dtype (skips are rare), so validation, checkpoints and EMA
    never see them. With gradient
    accumulation, a non-finite loss in any accumulated iteration skips the
    step. Skipping needs a single ``OptimWrapper``; with an
    ``OptimWrapperDict`` only the consistency checks run.

    Cost: the all-reduce of one float per rank per iteration, plus, on a
    checked iteration, an all-gather of six integers per rank.

    Args:
        check_first (int): Check the fingerprints in the first
            ``check_first`` iterations of the run (divergence usually shows
            at once). Defaults to 10.
        check_every (int): After those, check every ``check_every``-th
            iteration; 0 checks no more (with ``check_first=0`` as well,
            only non-finite losses are handled). Defaults to 50.
        skip_nonfinite (bool): Check the loss for NaN/inf in every
            iteration and skip the step on every rank when any rank's is.
            Defaults to True.
        max_consecutive_skips (int): Stop training with
            :class:`NonFiniteLossError` once this many steps in a row were
            skipped. Defaults to 5.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 check_first: int = 10,
                 check_every: int = 50,
                 skip_nonfinite: bool = True,
                 max_consecutive_skips: int = 5) -> None:
        _check_int(
            'check_first',
            check_first,
            minimum=0,
            meaning='number of first iterations to check')
        _check_int(
            'check_every',
            check_every,
            minimum=0,
            meaning='check every N-th iteration after check_first, 0 for '
            'never')
        _check_int(
            'max_consecutive_skips',
            max_consecutive_skips,
            minimum=1,
            meaning='skipped steps in a row that stop '
            'training')
        if not isinstance(skip_nonfinite, bool):
            raise TypeError(
                'RankConsistencyHook: skip_nonfinite must be True (skip '
                'non-finite steps on every rank) or False, but got '
                f'{skip_nonfinite!r} ({type(skip_nonfinite).__name__}).')
        self.check_first = check_first
        self.check_every = check_every
        self.skip_nonfinite = skip_nonfinite
        self.max_consecutive_skips = max_consecutive_skips
        self.checks = 0
        self.total_skips = 0
        self.consecutive_skips = 0
        self._iters_seen = 0
        self._iteration = 0
        self._check_now = False
        self._batch: Any = None
        self._collectives_at_start = UNKNOWN
        self._side: Optional[SideChannel] = None
        self._world_size = 1
        self._rank = 0
        self._comm_device = torch.device('cpu')
        self._pending_flags: List[Tuple[torch.Tensor, Any]] = []
        self._pending_log_vars: List[dict] = []
        # From iterations that ended without a step (gradient accumulation).
        self._carried_ranks: Set[int] = set()
        self._carried_keys: Set[str] = set()
        self._patched: List[Tuple[Any, str, Any]] = []
        self._message_hub = None
        self._model = None
        self._saw_losses = False
        self._in_train_iter = False

    # ---------------------------------------------------------------- hooks
    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._model = model
        self._message_hub = runner.message_hub
        if dist.is_available() and dist.is_initialized():
            self._world_size = dist.get_world_size()
            self._rank = dist.get_rank()
        if self._world_size > 1:
            self._comm_device = get_comm_device()
            self._side = SideChannel.open('RankConsistencyHook')
        self._patch(model, 'parse_losses', self._checked_parse_losses)
        if self.skip_nonfinite:
            self._guard_steps(runner)
        checks = (f'comparing {self._world_size} ranks in the first '
                  f'{self.check_first} iterations and every '
                  f'{self.check_every} iterations after, over the '
                  f'{self._side.kind}' if self._side is not None else
                  'a single process: nothing to compare')
        skips = (f'; a non-finite loss skips the step on every rank '
                 f'(training stops after {self.max_consecutive_skips} in a '
                 'row)' if self.skip_nonfinite else '')
        print_log(f'RankConsistencyHook: {checks}{skips}.', logger='current')

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: Any = None) -> None:
        self._iteration = runner.iter + 1  # as MMEngine's log lines count
        periodic = (
            self.check_every > 0 and self._iteration % self.check_every == 0)
        self._check_now = self._iters_seen < self.check_first or periodic
        self._iters_seen += 1
        self._in_train_iter = True
        if self._check_now:
            self._batch = data_batch
            if self._side is not None:
                self._collectives_at_start = collective_count(
                    dist.distributed_c10d._get_default_group())

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        self._batch = None
        self._in_train_iter = False
        if self._pending_flags:  # no step yet: keep a summary, not tensors
            self._carried_ranks.update(self._nonfinite_ranks())
            self._carried_keys.update(_nonfinite_keys(self._pending_log_vars))
            self._pending_log_vars = []
        if self._iters_seen == 1 and not self._saw_losses:
            print_log(
                "RankConsistencyHook: the model's train_step did not call "
                'parse_losses, so nothing can be checked; the hook only '
                'works with train steps that do (MMEngine and mmddp_ext '
                'wrappers, BaseModel.train_step).',
                logger='current',
                level=logging.WARNING)

    def after_train(self, runner) -> None:
        for owner, name, previous in reversed(self._patched):
            if previous is None:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self._patched = []
        print_log(
            f'RankConsistencyHook: {self.checks} consistency check(s) '
            f'passed; {self.total_skips} step(s) skipped for a non-finite '
            'loss.',
            logger='current')

    # ------------------------------------------------------------- wrapping
    def _guard_steps(self, runner) -> None:
        optim_wrapper = runner.optim_wrapper
        if isinstance(optim_wrapper, OptimWrapperDict):
            self.skip_nonfinite = False
            print_log(
                'RankConsistencyHook: skipping non-finite steps needs a '
                'single OptimWrapper, but optim_wrapper is an '
                'OptimWrapperDict; only the consistency checks run.',
                logger='current',
                level=logging.WARNING)
            return
        self._patch(optim_wrapper, 'step', self._guarded_step)
        self._message_hub.update_scalar(SKIPS_SCALAR, 0)

    def _patch(self, owner: Any, name: str, replacement: Callable) -> None:
        """Shadow ``owner.name`` with an instance attribute that calls the
        current one; ``after_train`` restores it."""
        original = getattr(owner, name)
        self._patched.append((owner, name, owner.__dict__.get(name)))

        def patched(*args, **kwargs):
            return replacement(original, *args, **kwargs)

        setattr(owner, name, patched)

    def _checked_parse_losses(self, original: Callable, losses: dict, *args,
                              **kwargs):
        parsed_loss, log_vars = original(losses, *args, **kwargs)
        if not self._in_train_iter:
            return parsed_loss, log_vars
        self._saw_losses = True
        if self._check_now and self._side is not None:
            self._check_fingerprints(losses)
        if self.skip_nonfinite:
            self._reduce_nonfinite_flags(parsed_loss)
            self._pending_log_vars.append(log_vars)
        return parsed_loss, log_vars

    def _guarded_step(self, original: Callable, *args, **kwargs):
        bad_ranks = self._carried_ranks.union(self._nonfinite_ranks())
        log_vars, self._pending_log_vars = self._pending_log_vars, []
        if not bad_ranks:
            self.consecutive_skips = 0
            return original(*args, **kwargs)
        local_keys = self._carried_keys.union(_nonfinite_keys(log_vars))
        self._carried_ranks, self._carried_keys = set(), set()
        for parsed in log_vars:  # keep nan out of the smoothed log values
            for key in local_keys:
                parsed.pop(key, None)
        self._skip_step(sorted(bad_ranks), local_keys)

    # ---------------------------------------------------------- consistency
    def _fingerprint(self, losses: dict) -> Dict[str, int]:
        collectives = UNKNOWN
        if self._collectives_at_start != UNKNOWN:
            collectives = collective_count(
                dist.distributed_c10d._get_default_group())
            collectives -= self._collectives_at_start
        return dict(
            iteration=self._iteration,
            loss_keys_hash=loss_keys_hash(list(losses)),
            num_loss_keys=len(losses),
            forward_collectives=collectives,
            trainable_params=sum(1 for p in self._model.parameters()
                                 if p.requires_grad),
            gt_boxes=gt_boxes_in(self._batch))

    def _check_fingerprints(self, losses: dict) -> None:
        """All-gather the fingerprints; on any difference, raise the same
        :class:`RankDivergenceError` on every rank."""
        self.checks += 1
        local = self._fingerprint(losses)
        rows = self._side.all_gather_ints(
            [local[f] for f in FINGERPRINT_FIELDS])
        compared = torch.tensor(rows)[:, :len(COMPARED_FIELDS)]
        if bool((compared == compared[0]).all()):
            return
        details = self._side.all_gather_object(
            dict(local, loss_keys=sorted(losses)))
        raise RankDivergenceError(describe_divergence(details))

    # ----------------------------------------------------------- non-finite
    def _reduce_nonfinite_flags(self, parsed_loss: Any) -> None:
        """Launch the all-reduce of this rank's non-finite flag. It is not
        waited for until the step, so the backward need not wait for the
        slowest rank's forward (DDP's all-reduces follow it in order)."""
        flags = torch.zeros(self._world_size, device=self._comm_device)
        if isinstance(parsed_loss, torch.Tensor):
            nonfinite = torch.isfinite(
                parsed_loss.detach()).all().logical_not()
            flags[self._rank] = nonfinite.to(flags)
        work = None
        if self._world_size > 1:
            work = dist.all_reduce(flags, async_op=True)
        self._pending_flags.append((flags, work))

    def _nonfinite_ranks(self) -> List[int]:
        """Ranks whose loss was non-finite in any iteration since the last
        step (several with gradient accumulation)."""
        pending, self._pending_flags = self._pending_flags, []
        bad = set()
        for flags, work in pending:
            if work is not None:
                work.wait()
            bad.update(int(r) for r in flags.nonzero().flatten().tolist())
        return sorted(bad)

    def _skip_step(self, bad_ranks: List[int], local_keys: Set[str]) -> None:
        self.total_skips += 1
        self.consecutive_skips += 1
        if len(local_keys) > 1:
            local_keys = local_keys - {'loss'}  # the total; terms are named
        names = sorted(local_keys)
        per_rank: List[Any] = [names]
        if self._side is not None:
            per_rank = self._side.all_gather_object(names)
        where = '; '.join(f'rank {r}: {keys_text(per_rank[r]) or "loss"}'
                          for r in bad_ranks)
        self._message_hub.update_scalar(SKIPS_SCALAR, self.total_skips)
        restored = self._restore_buffers(bad_ranks)
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f'RankConsistencyHook: {self.consecutive_skips} optimizer '
                'steps in a row were skipped for a non-finite (NaN/inf) '
                f'loss, the last in iteration {self._iteration} ({where}); '
                'every rank stops here. Lower the learning rate or enable '
                'gradient clipping (optim_wrapper.clip_grad), check the '
                'data of those iterations (degenerate boxes), or raise '
                'max_consecutive_skips of RankConsistencyHook to tolerate '
                'more.')
        print_log(
            f'RankConsistencyHook: non-finite loss in iteration '
            f'{self._iteration} ({where}); skipped this optimizer step on '
            f'every rank ({self.consecutive_skips} in a row, '
            f'{self.total_skips} in total; training stops after '
            f'{self.max_consecutive_skips} in a row){restored}.',
            logger='current',
            level=logging.WARNING)

    def _restore_buffers(self, bad_ranks: List[int]) -> str:
        """Copy the model's buffers from the lowest healthy rank to the
        offending ones (their forward may have left BatchNorm running
        statistics NaN; with ``broadcast_buffers=False`` nothing else would
        repair them). Every rank takes part in the broadcast, which runs on
        the default group: the backward has finished on every rank.

        Returns:
            str: What was done, for the log line.
        """
        buffers = [b for b in self._model.buffers() if b.numel()]
        if self._world_size == 1 or not buffers:
            return ''
        healthy = [r for r in range(self._world_size) if r not in bad_ranks]
        if not healthy:
            return ('; every rank was non-finite, so buffers such as '
                    'BatchNorm running statistics may stay non-finite')
        source = healthy[0]
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = {}
        for buffer in buffers:
            by_dtype.setdefault(buffer.dtype, []).append(buffer)
        with torch.no_grad():
            for group in by_dtype.values():
                flat = _flatten_dense_tensors(group)
                dist.broadcast(flat, src=source)
                if self._rank in bad_ranks:
                    for buffer, synced in zip(
                            group, _unflatten_dense_tensors(flat, group)):
                        buffer.copy_(synced)
        return (f'; buffers of {ranks_text(bad_ranks)} restored from rank '
                f'{source}')


def _nonfinite_keys(log_vars: List[dict]) -> Set[str]:
    """Keys of this rank's logged losses that are NaN/inf."""
    return {
        key
        for parsed in log_vars
        for key, value in parsed.items() if isinstance(value, torch.Tensor)
        and not bool(torch.isfinite(value).all())
    }


def _check_int(key: str, value: Any, minimum: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f'RankConsistencyHook: {key} ({meaning}) must be an int >= '
            f'{minimum}, but got {value!r} ({type(value).__name__}).')
    if value < minimum:
        raise ValueError(
            f'RankConsistencyHook: {key} ({meaning}) must be an int >= '
            f'{minimum}, but got {value}.')
