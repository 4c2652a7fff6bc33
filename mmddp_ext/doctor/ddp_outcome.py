"""What a launch on N GPUs does with what the probe recorded in one
iteration.

DDP is not run by the probe; its behaviour is derived from the records
(:func:`predict`), following how its reducer works:

- gradients go through buckets of parameters, all-reduced on the default
  process group in bucket order as soon as every gradient of a bucket is
  ready; a parameter without a gradient leaves its bucket, and every
  later one, unlaunched on that rank (``find_unused_parameters=False``);
- a backward that did not launch every bucket makes the rank raise
  "Expected to have finished reduction in the prior iteration before
  starting a new one" when the next iteration's forward starts;
- collectives on one process group pair up by order, whatever their op
  or size. NCCL does not check that paired calls match (the result is
  undefined: wrong values, or a wait until the collective timeout); gloo
  checks the size and aborts the rank whose buffer is too small ("Received
  data size doesn't match expected size"), and waits when the ops differ;
- a rank that waits in a collective whose peer is gone waits until the
  collective timeout on NCCL; on gloo the wait ends with a connection
  error once the peer's process has exited; torchrun stops every rank as
  soon as one exits with an error, a launcher that does not (``srun``
  without ``--kill-on-bad-exit``, plain processes) leaves them waiting.

AutoDDP's first step runs without DDP (its all-reduce of the usage
counts is the only collective after the backward); after it, on the fast
path, AutoDDP compares the ranks' unused parameters at the end of every
backward over a side channel and every rank raises
``UnexpectedUnusedParameterError`` instead of waiting.
``RankConsistencyHook`` compares each rank's forward collective count
before the backward.
"""
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..wrappers.auto_ddp import group_param_names

FINISHED_REDUCTION = ("'Expected to have finished reduction in the prior "
                      "iteration before starting a new one'")
SIZE_MISMATCH = "'Received data size doesn't match expected size'"


@dataclass
class Context:
    """What the predictions need besides one iteration's records.

    Args:
        setup: The resolved DDP set-up (``DDPSetup``).
        trainable (list[str]): Trainable parameter names.
        timeout_s (float): The launch's collective timeout.
        autoddp_mode (str | None): AutoDDP's decision after its first step
            (None when AutoDDP does not decide).
        decision_iteration (int | None): The iteration AutoDDP probes.
        ignored (list[str]): Parameters AutoDDP leaves out of DDP.
        excluded (list[str]): Parameters left out of the per-iteration
            predictions because another finding reports them (unused on
            every rank from the first iteration on).
        hooks (list[str]): Class names of the runner's hooks.
        first_bucket (str): DDP's first gradient bucket, as
            ``'float32[N]'``.
    """
    setup: Any
    trainable: List[str]
    timeout_s: float
    autoddp_mode: Optional[str] = None
    decision_iteration: Optional[int] = None
    ignored: List[str] = field(default_factory=list)
    excluded: List[str] = field(default_factory=list)
    hooks: List[str] = field(default_factory=list)
    first_bucket: str = 'float32[?]'

    @property
    def find_unused(self) -> bool:
        if self.autoddp_mode is not None:
            return self.autoddp_mode == 'find_unused'
        return bool(self.setup.find_unused)

    def timeout_text(self) -> str:
        return f'the collective timeout ({self.timeout_s:.0f} s)'


@dataclass
class Outcome:
    """What DDP on N GPUs does in an iteration.

    Args:
        fails (bool): Training stops (an error or a hang).
        text (str): What happens, for the report.
        mechanism (str): 'crash', 'collectives', 'buckets', 'autoddp',
            'hook' or 'none'.
        details (dict): Machine-readable facts.
    """
    fails: bool
    text: str
    mechanism: str = 'none'
    details: Dict[str, Any] = field(default_factory=dict)


def ranks_text(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    return (f'rank {ranks[0]}' if len(ranks) == 1 else 'ranks ' +
            ', '.join(map(str, ranks)))


def verb(ranks: Sequence[int], singular: str, plural: str) -> str:
    """``'rank 1 raises'`` / ``'ranks 0, 1 raise'``."""
    return f'{ranks_text(ranks)} {singular if len(ranks) == 1 else plural}'


def _mark(mark: str) -> str:
    if mark.startswith('<end of'):
        return f'has finished its {mark[8:-1]}'
    if mark.startswith('<error'):
        return f'stopped with {mark[8:-1]}'
    return f'calls {mark}'


def _op(call: str) -> str:
    return call.split('(', 1)[0]


def next_ddp_collective(k: int, ctx: Context) -> Tuple[str, str]:
    """The first default-group collective after a rank's forward: what it
    is, and its call as the recorder writes calls."""
    if ctx.decision_iteration == k:
        return ("AutoDDP's all-reduce of the usage counts after the "
                'backward', f'all_reduce(int32[2, {len(ctx.trainable)}])')
    return ("DDP's first gradient-bucket all-reduce in the backward",
            f'all_reduce({ctx.first_bucket})')


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _wait_text(waiting: Sequence[int], gone: Sequence[int],
               ctx: Context) -> str:
    return (f"on NCCL {verb(waiting, 'waits', 'wait')} there until "
            f'{ctx.timeout_text()}; on gloo the wait ends with a connection '
            f"error once {verb(gone, 'exits', 'exit')}; torchrun stops every "
            'rank as soon as one exits with an error, srun without '
            '--kill-on-bad-exit and plain processes do not')


def _pairing_text(calls: Dict[int, str]) -> str:
    """What NCCL and gloo do when ``calls`` (rank -> call) pair up."""
    ops = {_op(c) for c in calls.values()}
    if len(ops) > 1:
        return ('NCCL does not check that paired calls match: the result '
                'is undefined, in practice a wait until the collective '
                'timeout; gloo waits until its timeout')
    sizes = {r: c for r, c in calls.items()}
    smaller = min(sizes, key=lambda r: _numel(sizes[r]))
    return ('NCCL does not check that the sizes match: the ranks exchange '
            'buffers of different lengths (wrong values, or a wait until '
            f'the collective timeout); gloo aborts rank {smaller}, whose '
            f'buffer is the smaller, with {SIZE_MISMATCH}')


def _numel(call: str) -> int:
    """Elements of the first tensor of a recorded call ('op(float32[2,
    3], ...)'); 0 when none is listed."""
    inside = call.split('(', 1)[-1]
    if '[' not in inside:
        return 0
    dims = inside.split('[', 1)[1].split(']', 1)[0]
    numel = 1
    for dim in dims.split(','):
        dim = dim.strip()
        if dim.isdigit():
            numel *= int(dim)
    return numel


def first_call_after(rec: dict, phase: str) -> Optional[str]:
    """The first default-group collective a rank issued in ``phase``
    (recorded even when it ran with single-process semantics)."""
    for event in rec.get('collectives', []):
        if event['phase'] == phase and event.get('default_group', True):
            return event['call']
    return None


def _unmatched(mark: str, k: int, rec: dict, ctx: Context) -> str:
    """The collective a rank that went on (its lockstep ``mark`` when a
    peer stopped) waits in."""
    if mark and not mark.startswith('<'):
        return mark
    if mark in ('', '<end of before_train_iter hooks>'):
        call = first_call_after(rec, 'forward')
        if call is not None:
            return f'{call}, the first collective of its forward'
    if mark in ('', '<end of before_train_iter hooks>', '<end of forward>'):
        what, call = next_ddp_collective(k, ctx)
        return f'{what}, {call}'
    if mark == '<end of backward>':
        return ("DDP's gradient-bucket all-reduces of the backward, which "
                'the stopped rank launched only in part')
    return f'the first collective of iteration {k + 1}'


def crash_outcome(k: int, failed: Dict[int, dict], recs: List[dict],
                  ctx: Context) -> Outcome:
    """Ranks ``failed`` raised (their error records) in iteration ``k``."""
    world = len(recs)
    first_rank = min(failed)
    error = failed[first_rank]
    raised = f"{error['type']}: {error['message'].splitlines()[0][:200]}"
    if len(failed) == world:
        return Outcome(
            True, f"every rank raises {raised} in the {error['phase']} of "
            f'iteration {k}: training stops there (no hang).', 'crash',
            dict(ranks=sorted(failed)))
    waiting = [r for r in range(world) if r not in failed]
    divergence = next((rec['divergence'] for rec in recs
                       if rec['divergence']), None)
    marks = divergence['per_rank'] if divergence else [''] * world
    where = [
        f'rank {rank} in {_unmatched(marks[rank], k, recs[rank], ctx)}'
        for rank in waiting
    ]
    return Outcome(
        True, f"{verb(sorted(failed), 'raises', 'raise')} {raised} in the "
        f"{error['phase']} of iteration {k}. The other ranks go on to their "
        f"next collective, which stays unmatched: {'; '.join(where)}. "
        + _sentence(_wait_text(waiting, sorted(failed), ctx)) + '.', 'crash',
        dict(ranks=sorted(failed), waiting=waiting))


def collective_outcome(k: int, divergence: dict, recs: List[dict],
                       ctx: Context) -> Outcome:
    """The ranks' collectives differ in ``divergence`` (the recorder's)."""
    marks = divergence['per_rank']
    phase = divergence['phase']
    shown = '; '.join(f'rank {r} {_mark(m)}' for r, m in enumerate(marks))
    text = (f"iteration {k}, {phase} collective #{divergence['index'] + 1}: "
            f'{shown}. ')
    finished = [r for r, m in enumerate(marks) if m.startswith('<end of')]
    callers = [r for r, m in enumerate(marks) if not m.startswith('<')]
    if finished and callers and phase == 'forward':
        what, bucket = next_ddp_collective(k, ctx)
        text += (f"{ranks_text(callers)}'s {marks[callers[0]]} pairs with "
                 f"{ranks_text(finished)}'s {what}, {bucket}: " +
                 _pairing_text({
                     callers[0]: marks[callers[0]],
                     finished[0]: bucket
                 }) + '.')
    elif len(callers) > 1:
        text += ('the calls pair up by order: ' +
                 _pairing_text({r: marks[r]
                                for r in callers}) + '.')
    elif callers:
        waiting = callers
        text += (f"{verb(waiting, 'waits', 'wait')} in a call no peer makes: "
                 + _wait_text(waiting, finished, ctx) + '.')
    else:
        text += 'the ranks stop at different points.'
    if 'RankConsistencyHook' in ctx.hooks and phase == 'forward':
        text += (' RankConsistencyHook (in this config) compares the '
                 'forward collective counts before the backward: on NCCL, '
                 'whose collectives do not block the host, every rank '
                 f'raises RankDivergenceError in iteration {k} instead; on '
                 'gloo the unmatched call blocks first.')
    return Outcome(True, text, 'collectives', dict(divergence))


def _missing(recs: List[dict], ctx: Context) -> Dict[int, List[str]]:
    """Per rank, the parameters DDP holds that got no gradient."""
    left_out = set(ctx.ignored) | set(ctx.excluded)
    held = [n for n in ctx.trainable if n not in left_out]
    return {
        rank: [n for n in held if n in set(rec['no_grad'])]
        for rank, rec in enumerate(recs)
    }


def bucket_outcome(k: int, recs: List[dict], ctx: Context) -> Outcome:
    """DDP's reducer against the gradients each rank produced."""
    if ctx.decision_iteration == k:
        return Outcome(False, f'AutoDDP runs iteration {k} without DDP and '
                       f'decides {ctx.autoddp_mode!r}.')
    missing = {r: m for r, m in _missing(recs, ctx).items() if m}
    if not missing:
        return Outcome(False, 'every rank produced every gradient DDP '
                       'holds.')
    if ctx.find_unused:
        return Outcome(False, 'find_unused_parameters=True: DDP marks the '
                       'parameters a rank did not use as ready.')
    rank = min(missing)
    names = missing[rank]
    listed = group_param_names(names)
    gt = recs[rank]['gt_boxes']
    details = dict(rank=rank, parameters=names, missing=missing)
    if ctx.autoddp_mode is not None or (ctx.setup.auto_ddp
                                        and ctx.setup.find_unused is False):
        return Outcome(
            True, f'AutoDDP ({ctx.autoddp_mode or "static"} after its first '
            'step) compares the unused parameters of the ranks at the end '
            f'of the backward: every rank raises '
            f'UnexpectedUnusedParameterError in iteration {k} naming '
            f'{listed} ({ranks_text(sorted(missing))}; {gt} GT boxes on '
            f'rank {rank}); no hang. With MAX_RESTARTS, the restarted run '
            'resumes with find_unused_parameters=True.', 'autoddp', details)
    world = len(recs)
    same = len(missing) == world and len(
        {tuple(m) for m in missing.values()}) == 1
    if same:
        return Outcome(
            True, f'no rank all-reduces the gradient bucket holding '
            f'{listed}; every rank raises {FINISHED_REDUCTION} when '
            f'iteration {k + 1} starts (no hang).', 'buckets', details)
    complete = [r for r in range(world) if r not in missing]
    others = complete or [r for r in missing if r != rank]
    return Outcome(
        True, f"{verb(sorted(missing), 'gives', 'give')} no gradient to "
        f'{listed} ({gt} GT boxes on rank {rank}), so the gradient bucket '
        f'holding them is never all-reduced there, while '
        f"{verb(others, 'all-reduces', 'all-reduce')} it at the end of the "
        f"backward and {'waits' if len(others) == 1 else 'wait'} for the "
        'peer: '
        f'{_wait_text(others, sorted(missing), ctx)}.'
        f' Rank {rank} raises {FINISHED_REDUCTION} when iteration {k + 1} '
        'starts.', 'buckets', details)


def predict(k: int, recs: List[dict], ctx: Context,
            user_failed: Dict[int, dict]) -> Outcome:
    """The first thing that goes wrong on N GPUs in iteration ``k``, in
    the order the step runs: an exception, a collective of the forward
    that does not pair up, a gradient bucket that does not fill, a
    collective of the backward."""
    if user_failed:
        return crash_outcome(k, user_failed, recs, ctx)
    divergences = [rec['divergence'] for rec in recs if rec['divergence']]
    forward = [d for d in divergences if d['phase'] != 'backward']
    if forward:
        return collective_outcome(k, forward[0], recs, ctx)
    buckets = bucket_outcome(k, recs, ctx)
    if buckets.fails or not divergences:
        return buckets
    return collective_outcome(k, divergences[0], recs, ctx)
