"""Fail fast, with one clear error, when DDP ranks diverge."""
import logging
from typing import Any, Dict, Iterable, Optional

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from ..launch.side_channel import SideChannel
from .loss_tap import add_loss_listener, remove_loss_listener
from .rank_fingerprint import (COMPARED_FIELDS, FINGERPRINT_FIELDS, UNKNOWN,
                               RankDivergenceError, collective_count,
                               describe_divergence, gt_boxes_in,
                               loss_keys_hash)

# Arguments this hook took before NonFiniteSkipHook did the skipping.
MOVED_TO_NONFINITE_SKIP = ('skip_nonfinite', 'max_consecutive_skips')


def refuse_moved_skip_args(args: Iterable[str],
                           in_ext_cfg: bool = False) -> None:
    """Refuse the arguments this hook took before ``NonFiniteSkipHook`` did
    the skipping (:data:`MOVED_TO_NONFINITE_SKIP`), saying where they
    belong now.

    The one check for them: ``RankConsistencyHook`` calls it with the
    arguments it does not take, and
    :func:`~mmddp_ext.runner.ext_cfg.checked_ext_cfg` (which ``ExtRunner``
    and the DDP doctor call) with the keys of
    ``mmddp_ext_cfg.rank_consistency``.

    Args:
        args (Iterable[str]): The argument names given.
        in_ext_cfg (bool): They are the keys of
            ``mmddp_ext_cfg.rank_consistency`` (the fix is
            ``mmddp_ext_cfg.nonfinite_skip``), not the hook's arguments
            (the fix is a ``NonFiniteSkipHook`` in ``custom_hooks``).
            Defaults to False.

    Raises:
        TypeError: The hook's arguments include one of them.
        ValueError: ``mmddp_ext_cfg.rank_consistency`` sets one of them.
    """
    moved = sorted(set(args) & set(MOVED_TO_NONFINITE_SKIP))
    if not moved:
        return
    if in_ext_cfg:
        raise ValueError(
            f'mmddp_ext_cfg.rank_consistency sets {moved}, but '
            'RankConsistencyHook only checks that the ranks agree; skipping '
            "steps with a non-finite loss is NonFiniteSkipHook's, under "
            'mmddp_ext_cfg.nonfinite_skip. Remove them from rank_consistency '
            'and set nonfinite_skip=dict(max_consecutive_skips=N) to skip '
            '(N defaults to 5), or nonfinite_skip=None not to.')
    raise TypeError(
        f'RankConsistencyHook got {moved}, but it only checks that the '
        'ranks agree; skipping steps with a non-finite loss is '
        "NonFiniteSkipHook's. Remove them here and add "
        "dict(type='NonFiniteSkipHook', max_consecutive_skips=N) to "
        'custom_hooks (mmddp_ext_cfg.nonfinite_skip=dict(...) with '
        'ExtRunner) to skip such steps.')


def move_skip_args(ext_cfg: Dict[str, Any]) -> Dict[str, Any]:
    """``mmddp_ext_cfg`` (``ext_cfg``) with the keys
    :func:`refuse_moved_skip_args` refuses under ``rank_consistency`` moved
    to ``nonfinite_skip``, which takes them now: ``skip_nonfinite=False``
    becomes ``nonfinite_skip=None``, ``max_consecutive_skips`` its key of
    that name. A config without them comes back unchanged (a copy); the DDP
    doctor pastes the result as the fix."""
    moved_cfg = dict(ext_cfg)
    checks = ext_cfg.get('rank_consistency')
    moved = {
        k: checks[k]
        for k in MOVED_TO_NONFINITE_SKIP if k in checks
    } if isinstance(checks, dict) else {}
    if not moved:
        return moved_cfg
    moved_cfg['rank_consistency'] = {
        k: v
        for k, v in checks.items() if k not in moved
    }
    if moved.get('skip_nonfinite', True) is False:
        moved_cfg['nonfinite_skip'] = None
        return moved_cfg
    skip = dict(moved_cfg.get('nonfinite_skip') or {})
    if 'max_consecutive_skips' in moved:
        skip['max_consecutive_skips'] = moved['max_consecutive_skips']
    moved_cfg['nonfinite_skip'] = skip
    return moved_cfg


@HOOKS.register_module()
class RankConsistencyHook(Hook):
    """Fail fast, with one clear error, when DDP ranks diverge.

    ``custom_hooks = [dict(type='RankConsistencyHook')]`` (``ExtRunner``
    registers it when ``mmddp_ext_cfg.rank_consistency`` is a dict).

    The hook needs no stage between forward and backward of its own: at
    ``before_train`` it listens to the model's ``parse_losses``
    (:mod:`~mmddp_ext.hooks.loss_tap`), which both
    ``MMDistributedDataParallel.train_step`` and ``AutoDDP.train_step``
    call after the forward and before ``optim_wrapper.update_params``. The
    tap is removed at ``after_train``.

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
    (:class:`~mmddp_ext.launch.side_channel.SideChannel`: a gloo group of
    its own, created at ``before_train`` with the default group's timeout,
    or, where gloo cannot connect across nodes, the default group's store,
    with one warning naming ``GLOO_SOCKET_IFNAME``), so it never pairs
    with a collective of the model: a rank whose forward launched an extra
    NCCL collective still reaches the check, and the difference is
    reported instead of a hang. (With gloo a collective
    blocks the host, so a rank stuck in an extra one does not reach the
    check; the collective timeout ends that run.)

    It checks and nothing else: skipping steps with a non-finite loss is
    :class:`~mmddp_ext.hooks.NonFiniteSkipHook`'s job
    (``mmddp_ext_cfg.nonfinite_skip``).

    Cost: on a checked iteration, an all-gather of six integers per rank.

    Args:
        check_first (int): Check the fingerprints in the first
            ``check_first`` iterations of the run (divergence usually shows
            at once). Defaults to 10.
        check_every (int): After those, check every ``check_every``-th
            iteration; 0 checks no more. Defaults to 50.

    Raises:
        TypeError: ``skip_nonfinite`` or ``max_consecutive_skips`` is given
            (arguments of ``NonFiniteSkipHook``), or another unknown
            argument.
    """

    priority = 'VERY_HIGH'

    def __init__(self,
                 check_first: int = 10,
                 check_every: int = 50,
                 **unknown: Any) -> None:
        refuse_moved_skip_args(unknown)
        if unknown:
            raise TypeError(
                'RankConsistencyHook got unexpected argument(s) '
                f'{sorted(unknown)}; it takes check_first and check_every.')
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
        self.check_first = check_first
        self.check_every = check_every
        self.checks = 0
        self._iters_seen = 0
        self._iteration = 0
        self._check_now = False
        self._batch: Any = None
        self._collectives_at_start = UNKNOWN
        self._side: Optional[SideChannel] = None
        self._world_size = 1
        self._model = None
        self._saw_losses = False
        self._in_train_iter = False

    # ---------------------------------------------------------------- hooks
    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._model = model
        if dist.is_available() and dist.is_initialized():
            self._world_size = dist.get_world_size()
        if self._world_size > 1:
            self._side = SideChannel.open('RankConsistencyHook')
        add_loss_listener(model, self._on_losses)
        checks = (f'comparing {self._world_size} ranks in the first '
                  f'{self.check_first} iterations and every '
                  f'{self.check_every} iterations after, over the '
                  f'{self._side.kind}' if self._side is not None else
                  'a single process: nothing to compare')
        print_log(f'RankConsistencyHook: {checks}.', logger='current')

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
                    dist.group.WORLD)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        self._batch = None
        self._in_train_iter = False
        if self._iters_seen == 1 and not self._saw_losses:
            print_log(
                "RankConsistencyHook: the model's train_step did not call "
                'parse_losses, so nothing can be checked; the hook only '
                'works with train steps that do (MMEngine and mmddp_ext '
                'wrappers, BaseModel.train_step).',
                logger='current',
                level=logging.WARNING)

    def after_train(self, runner) -> None:
        remove_loss_listener(self._model, self._on_losses)
        print_log(
            f'RankConsistencyHook: {self.checks} consistency check(s) '
            'passed.',
            logger='current')

    # ---------------------------------------------------------- consistency
    def _on_losses(self, losses: dict, parsed_loss: Any,
                   log_vars: dict) -> None:
        if not self._in_train_iter:
            return
        self._saw_losses = True
        if self._check_now and self._side is not None:
            self._check_fingerprints(losses)

    def _fingerprint(self, losses: dict) -> Dict[str, int]:
        collectives = UNKNOWN
        if self._collectives_at_start != UNKNOWN:
            collectives = collective_count(
                dist.group.WORLD)
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


def _check_int(key: str, value: Any, minimum: int, meaning: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f'RankConsistencyHook: {key} ({meaning}) must be an int >= '
            f'{minimum}, but got {value!r} ({type(value).__name__}).')
    if value < minimum:
        raise ValueError(
            f'RankConsistencyHook: {key} ({meaning}) must be an int >= '
            f'{minimum}, but got {value}.')
