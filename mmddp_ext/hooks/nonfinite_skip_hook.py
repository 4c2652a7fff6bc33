"""Skip optimizer steps with a non-finite loss on every rank together."""
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

from ..launch.side_channel import SideChannel
from ..optim.ext_amp_optim_wrapper import back_off_loss_scale
from ..utils.text import ranks_text
from ..utils.torch_private import flatten, unflatten
from .loss_tap import add_loss_listener, remove_loss_listener
from .rank_fingerprint import keys_text

SKIPS_SCALAR = 'train/nonfinite_skips'


class NonFiniteLossError(RuntimeError):
    """The loss stayed non-finite for too many iterations in a row; raised
    on every rank with the same message."""


@HOOKS.register_module()
class NonFiniteSkipHook(Hook):
    """Skip optimizer steps with a non-finite loss on every rank together.

    ``custom_hooks = [dict(type='NonFiniteSkipHook')]`` (``ExtRunner``
    registers it when ``mmddp_ext_cfg.nonfinite_skip`` is a dict).

    Each rank marks its slot in a world-size vector when its total loss
    (``parse_losses``' sum of the ``loss`` terms, read through
    :mod:`~mmddp_ext.hooks.loss_tap`) is NaN/inf; one all-reduce of that
    vector on the default group (on the GPU with NCCL, launched before the
    backward and waited for at the step, so nothing stalls in between)
    gives every rank the same answer. The backward still runs everywhere,
    so DDP's collectives stay matched; if any rank was non-finite, every
    rank then skips ``optimizer.step`` (and gradient clipping) and the
    gradients are zeroed by ``update_params`` as usual, so the replicas
    stay identical. Rank 0 logs a warning naming the ranks and their
    non-finite loss keys, the count goes to the message hub as
    ``train/nonfinite_skips`` (in every log line), and the non-finite
    values are left out of the logged losses (they would show ``nan`` for
    a whole smoothing window). After ``max_consecutive_skips`` skipped
    steps in a row every rank raises :class:`NonFiniteLossError`. Buffers
    updated in the forward (BatchNorm running statistics, NaN after a NaN
    input) are restored on the offending ranks from the lowest healthy
    rank by one broadcast per buffer dtype (skips are rare), so
    validation, checkpoints and EMA never see them. With gradient
    accumulation, a non-finite loss in any accumulated iteration skips the
    step. Skipping needs a single ``OptimWrapper``; with an
    ``OptimWrapperDict`` the hook does nothing but warn. Under AMP the hook
    skips on a non-finite *loss* and lowers a dynamic loss scale as the
    scaler would have; the scaler keeps skipping on its own the steps whose
    gradients overflow with a finite loss (while the scale settles), which
    this hook neither repeats nor counts, so they never stop training.

    Cost: the all-reduce of one float per rank per iteration.

    Args:
        max_consecutive_skips (int): Stop training with
            :class:`NonFiniteLossError` once this many steps in a row were
            skipped. Defaults to 5.
    """

    priority = 'VERY_HIGH'

    def __init__(self, max_consecutive_skips: int = 5) -> None:
        limit = max_consecutive_skips
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(
                'NonFiniteSkipHook: max_consecutive_skips (skipped steps in '
                'a row that stop training) must be an int >= 1, but got '
                f'{max_consecutive_skips!r} '
                f'({type(max_consecutive_skips).__name__}).')
        if max_consecutive_skips < 1:
            raise ValueError(
                'NonFiniteSkipHook: max_consecutive_skips (skipped steps in '
                'a row that stop training) must be an int >= 1, but got '
                f'{max_consecutive_skips}.')
        self.max_consecutive_skips = max_consecutive_skips
        self.total_skips = 0
        self.consecutive_skips = 0
        self._iteration = 0
        self._side: Optional[SideChannel] = None
        self._world_size = 1
        self._rank = 0
        self._comm_device = torch.device('cpu')
        self._pending_flags: List[Tuple[torch.Tensor, Any]] = []
        self._pending_log_vars: List[dict] = []
        # From iterations that ended without a step (gradient accumulation).
        self._carried_ranks: Set[int] = set()
        self._carried_keys: Set[str] = set()
        self._message_hub = None
        self._model = None
        self._optim_wrapper = None
        self._previous_step = None
        self._active = False
        self._in_train_iter = False

    # ---------------------------------------------------------------- hooks
    def before_train(self, runner) -> None:
        optim_wrapper = runner.optim_wrapper
        if isinstance(optim_wrapper, OptimWrapperDict):
            print_log(
                'NonFiniteSkipHook: skipping non-finite steps needs a '
                'single OptimWrapper, but optim_wrapper is an '
                'OptimWrapperDict; no step is skipped.',
                logger='current',
                level=logging.WARNING)
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._model = model
        self._message_hub = runner.message_hub
        if dist.is_available() and dist.is_initialized():
            self._world_size = dist.get_world_size()
            self._rank = dist.get_rank()
        if self._world_size > 1:
            self._comm_device = get_comm_device()
        add_loss_listener(model, self._on_losses)
        # Shadow the wrapper's step with an instance attribute; after_train
        # puts back what was there.
        self._optim_wrapper = optim_wrapper
        self._previous_step = optim_wrapper.__dict__.get('step')
        original = optim_wrapper.step
        optim_wrapper.step = lambda *args, **kwargs: self._guarded_step(
            original, *args, **kwargs)
        self._message_hub.update_scalar(SKIPS_SCALAR, 0)
        self._active = True
        print_log(
            'NonFiniteSkipHook: a non-finite loss skips the step on every '
            f'rank (training stops after {self.max_consecutive_skips} in a '
            'row).',
            logger='current')

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch: Any = None) -> None:
        self._iteration = runner.iter + 1  # as MMEngine's log lines count
        self._in_train_iter = True

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        self._in_train_iter = False
        if self._pending_flags:  # no step yet: keep a summary, not tensors
            self._carried_ranks.update(self._nonfinite_ranks())
            self._carried_keys.update(_nonfinite_keys(self._pending_log_vars))
            self._pending_log_vars = []

    def after_train(self, runner) -> None:
        if not self._active:
            return
        remove_loss_listener(self._model, self._on_losses)
        if self._previous_step is None:
            del self._optim_wrapper.step
        else:
            self._optim_wrapper.step = self._previous_step
        self._active = False
        print_log(
            f'NonFiniteSkipHook: {self.total_skips} step(s) skipped for a '
            'non-finite loss.',
            logger='current')

    # ------------------------------------------------------------ internals
    def _on_losses(self, losses: dict, parsed_loss: Any,
                   log_vars: dict) -> None:
        if not self._in_train_iter:
            return
        self._reduce_nonfinite_flags(parsed_loss)
        self._pending_log_vars.append(log_vars)

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
        if self._world_size > 1:
            if self._side is None:  # every rank skips this step: collective
                self._side = SideChannel.open('NonFiniteSkipHook')
            per_rank = self._side.all_gather_object(names)
        where = '; '.join(f'rank {r}: {keys_text(per_rank[r]) or "loss"}'
                          for r in bad_ranks)
        self._message_hub.update_scalar(SKIPS_SCALAR, self.total_skips)
        restored = self._restore_buffers(bad_ranks) + self._back_off_scale()
        if self.consecutive_skips >= self.max_consecutive_skips:
            raise NonFiniteLossError(
                f'NonFiniteSkipHook: {self.consecutive_skips} optimizer '
                'steps in a row were skipped for a non-finite (NaN/inf) '
                f'loss, the last in iteration {self._iteration} ({where}); '
                'every rank stops here. Lower the learning rate or enable '
                'gradient clipping (optim_wrapper.clip_grad), check the '
                'data of those iterations (degenerate boxes), or raise '
                'max_consecutive_skips of NonFiniteSkipHook '
                '(mmddp_ext_cfg.nonfinite_skip) to tolerate more.')
        print_log(
            f'NonFiniteSkipHook: non-finite loss in iteration '
            f'{self._iteration} ({where}); skipped this optimizer step on '
            f'every rank ({self.consecutive_skips} in a row, '
            f'{self.total_skips} in total; training stops after '
            f'{self.max_consecutive_skips} in a row){restored}.',
            logger='current',
            level=logging.WARNING)

    def _back_off_scale(self) -> str:
        """Under AMP with a dynamic loss scale, lower the scale as the
        scaler would have: it never saw this step, whose non-finite loss
        makes non-finite gradients, on which the scaler skips and backs
        off. The step is skipped once, by this hook (the scaler's own
        skips, on overflowing gradients of a finite loss, are its own and
        do not count here); every rank backs off alike.

        Returns:
            str: What was done, for the log line.
        """
        wrapper = self._optim_wrapper
        scale = None
        if not hasattr(wrapper, 'back_off'):  # any other AMP wrapper
            scale = back_off_loss_scale(wrapper)
        elif wrapper.dynamic_scale:  # ExtAmpOptimWrapper keeps its count
            wrapper.back_off()
            scale = wrapper.loss_scaler.get_scale()
        if scale is None:
            return ''
        return f'; loss scale lowered to {scale:g}, as AMP\'s scaler does'

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
                flat = flatten(group)
                dist.broadcast(flat, src=source)
                if self._rank in bad_ranks:
                    for buffer, synced in zip(
                            group, unflatten(flat, group)):
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
