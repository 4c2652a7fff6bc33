"""Turn the per-rank probe records into verdicts: compare the ranks, and
predict what the configured DDP wrapper would do with what each rank did.

Each finding names the rank, the iteration and the first differing loss
key, collective or parameter, and says what happens on NCCL, where a
mismatched collective waits for its peer until the timeout instead of
failing.
"""
from collections import Counter
from typing import Any, Dict, List, Optional, Sequence

from ..wrappers.auto_ddp import group_param_names
from .ddp_setup import DDPSetup
from .report import BLOCKER, OK, WARN, Check

PHASE = 'dynamic'
OPT_IN_FIX = [
    "_base_ = ['./your_config.py', "
    "'<mmddp_ext>/configs/_base_/mmddp_ext.py']",
]
AUTODDP_FIX = [
    "model_wrapper_cfg = dict(type='AutoDDP')",
    "custom_imports = dict(imports=['mmddp_ext'], "
    'allow_failed_imports=False)',
]
EMPTY_GT_FIX = [
    "model = dict(type='DDPSafeDINO', bbox_head=dict(type='DDPSafeDINOHead'))"
    '  # DINO-family heads, or subclass DDPSafeDINOHead',
    "train_dataloader = dict(collate_fn=dict(type='empty_gt_guard_collate', "
    "policy='swap'))  # any other head",
]
STOCK_UNUSED_CRASH = ("'Expected to have finished reduction in the prior "
                      "iteration before starting a new one'")
READY_TWICE = "'Expected to mark a variable ready only once'"


def _per_iteration(results: Sequence[dict]) -> List[List[dict]]:
    iters = min(len(r['iterations']) for r in results)
    return [[r['iterations'][k] for r in results] for k in range(iters)]


def _where(rec: dict) -> str:
    return f"iteration {rec['iteration']} ({rec['kind']})"


def _ranks(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    return (f'rank {ranks[0]}' if len(ranks) == 1 else 'ranks ' +
            ', '.join(map(str, ranks)))


def check_errors(iters: List[List[dict]]) -> Check:
    for recs in iters:
        failed = [(r, rec['error']) for r, rec in enumerate(recs)
                  if rec['error']]
        if failed:
            rank, error = failed[0]
            return Check(
                PHASE, 'runs on every rank', BLOCKER,
                f'{_ranks([r for r, _ in failed])} raised in '
                f'{_where(recs[rank])}: {error}',
                on_gpus=f'rank {rank} crashes in iteration '
                f"{recs[rank]['iteration']}; its peers wait in their next "
                'collective until the NCCL timeout.',
                details=dict(iteration=recs[rank]['iteration'], rank=rank,
                             error=error))
    return Check(PHASE, 'runs on every rank', OK,
                 f'every rank ran all {len(iters)} iterations')


def _reference(key_sets: List[tuple]) -> tuple:
    counts = Counter(key_sets)
    return max(key_sets, key=lambda s: (counts[s], -key_sets.index(s)))


def check_loss_keys(iters: List[List[dict]], setup: DDPSetup) -> Check:
    for recs in iters:
        key_sets = [tuple(rec['loss_keys']) for rec in recs
                    if not rec['error']]
        if len(set(key_sets)) <= 1:
            continue
        reference = _reference(key_sets)
        lines, first = [], None
        for rank, rec in enumerate(recs):
            keys = set(rec['loss_keys'])
            extra = sorted(keys - set(reference))
            missing = sorted(set(reference) - keys)
            if rec['error'] or not (extra or missing):
                continue
            first = first or dict(rank=rank, extra=extra, missing=missing,
                                  gt_boxes=rec['gt_boxes'])
            parts = ([f"has extra loss key(s) {', '.join(extra)}"] if extra
                     else []) + ([f"lacks {', '.join(missing)}"]
                                 if missing else [])
            lines.append(f"rank {rank} {' and '.join(parts)} "
                         f"({rec['gt_boxes']} GT boxes in its batch)")
        rec = recs[first['rank']]
        empty = first['gt_boxes'] == 0
        on_gpus = ('RankConsistencyHook stops every rank at this iteration '
                   'with RankDivergenceError (no hang).'
                   if setup.rank_consistency else
                   'the ranks build different graphs: DDP\'s gradient '
                   'buckets and the loss collectives no longer pair up, so '
                   f"NCCL hangs in iteration {rec['iteration']} until its "
                   'timeout.')
        fix = EMPTY_GT_FIX if empty else [
            '# compute every loss term on every rank, with zero weight '
            'where it does not apply']
        return Check(
            PHASE, 'loss keys', BLOCKER,
            f'{_where(rec)}: ' + '; '.join(lines) +
            f' (the others have {len(reference)} keys)',
            on_gpus=on_gpus,
            fix=fix,
            details=dict(iteration=rec['iteration'], **first))
    return Check(PHASE, 'loss keys', OK,
                 'every rank produced the same loss keys in every iteration')


def _describe_mark(mark: str) -> str:
    if mark.startswith('<end of'):
        return f'has finished its {mark[8:-1]}'
    if mark.startswith('<error'):
        return 'stopped with an error'
    return f'calls {mark}'


def check_collectives(iters: List[List[dict]], setup: DDPSetup) -> Check:
    for recs in iters:
        divergence = next(
            (rec['divergence'] for rec in recs if rec['divergence']), None)
        if divergence is None:
            continue
        rec = recs[0]
        marks = divergence['per_rank']
        shown = '; '.join(f'rank {r} {_describe_mark(m)}'
                          for r, m in enumerate(marks))
        ended = any(m.startswith('<') for m in marks)
        on_gpus = (
            f"NCCL hangs in iteration {rec['iteration']}: the extra call "
            'waits for peers that never make it (or pairs with DDP\'s '
            'gradient all-reduce and fails on the size).' if ended else
            f"NCCL pairs calls of different op or size in iteration "
            f"{rec['iteration']}: a crash, or silently wrong values.")
        if setup.rank_consistency and divergence['phase'] == 'forward':
            on_gpus = ('RankConsistencyHook compares the forward\'s '
                       'collective count before the backward and stops '
                       f"every rank in iteration {rec['iteration']} with "
                       'RankDivergenceError; without it, ' + on_gpus)
        return Check(
            PHASE, 'collectives', BLOCKER,
            f"{_where(rec)}, {divergence['phase']} collective "
            f"#{divergence['index'] + 1}: {shown}",
            on_gpus=on_gpus,
            fix=['# issue every collective (reduce_mean of a loss '
                 'normaliser, ...) unconditionally, on every rank'],
            details=dict(iteration=rec['iteration'], **divergence))
    counts = [len(rec['collectives']) for rec in iters[0]] if iters else [0]
    calls = Counter(e['call'] for e in iters[0][0]['collectives']) \
        if iters else Counter()
    common = ', '.join(f'{c} x{n}' for c, n in calls.most_common(3))
    return Check(
        PHASE, 'collectives', OK,
        f'every rank issued the same collectives in every iteration '
        f'({counts[0]} in iteration 0{": " + common if common else ""})')


def _usage(recs: List[dict], names: List[str]) -> Dict[str, List[int]]:
    """For each parameter, the ranks on which it got no gradient."""
    missing: Dict[str, List[int]] = {}
    for rank, rec in enumerate(recs):
        for name in rec['no_grad']:
            missing.setdefault(name, []).append(rank)
    return {n: missing[n] for n in names if n in missing}


def autoddp_decision(first: List[dict], trainable: List[str]) -> str:
    """AutoDDP's mode after its probe step (see ``AutoDDP``)."""
    missing = _usage(first, trainable)
    world = len(first)
    if any(len(r) < world for r in missing.values()):
        return 'find_unused'
    return 'ignore_unused' if missing else 'static'


def check_unused(iters: List[List[dict]], setup: DDPSetup,
                 trainable: List[str]) -> Check:
    first = iters[0]
    world = len(first)
    never = [n for n, r in _usage(first, trainable).items()
             if len(r) == world]
    name = 'unused parameters'
    if not never:
        return Check(PHASE, name, OK,
                     'every trainable parameter received a gradient in '
                     'iteration 0 on some rank')
    listed = group_param_names(never)
    details = dict(parameters=never, iteration=0)
    if setup.auto_ddp and setup.find_unused is None:
        return Check(
            PHASE, name, OK,
            f'{len(never)} parameter(s) get no gradient on any rank '
            f'({listed}); AutoDDP leaves them out of DDP and keeps the fast '
            'path.', details=details)
    if setup.find_unused:
        return Check(
            PHASE, name, WARN,
            f'{len(never)} parameter(s) get no gradient on any rank '
            f'({listed}); find_unused_parameters=True copes, at the cost of '
            'a graph traversal every iteration.',
            on_gpus='trains, slower than needed.', fix=AUTODDP_FIX,
            details=details)
    who = 'AutoDDP (find_unused_parameters=False)' if setup.auto_ddp else (
        f'{setup.wrapper} with find_unused_parameters=False')
    return Check(
        PHASE, name, BLOCKER,
        f'{len(never)} parameter(s) get no gradient on any rank: {listed}. '
        f'{who} needs every parameter in the loss. Use AutoDDP: it finds '
        'them in its first step and leaves them out of DDP.',
        on_gpus=('every rank fails at iteration 1 with '
                 f'{STOCK_UNUSED_CRASH}' if not setup.auto_ddp else
                 'AutoDDP stops every rank at iteration 0 naming them.'),
        fix=OPT_IN_FIX + ['# or, without the rest of mmddp_ext:'] +
        AUTODDP_FIX,
        details=details)


def check_usage(iters: List[List[dict]], setup: DDPSetup,
                trainable: List[str]) -> Check:
    """Parameters whose gradient depends on the rank or the iteration,
    against the flag DDP would run with."""
    name = 'gradients on every rank'
    world = len(iters[0])
    never = {n for n, r in _usage(iters[0], trainable).items()
             if len(r) == world}
    deciding = setup.auto_ddp and setup.find_unused is None
    mode = autoddp_decision(iters[0], trainable) if deciding else None
    flag = (mode == 'find_unused') if deciding else bool(setup.find_unused)
    if flag:
        return Check(PHASE, name, OK,
                     'find_unused_parameters=True' +
                     (' (AutoDDP\'s decision)' if deciding else '') +
                     ': DDP copes with parameters used on some ranks only')
    for recs in iters[1 if deciding else 0:]:
        missing = {n: r for n, r in _usage(recs, trainable).items()
                   if n not in never}
        if not missing:
            continue
        rec = recs[0]
        k = rec['iteration']
        by_rank: Dict[int, List[str]] = {}
        for param, ranks in missing.items():
            for rank in ranks:
                by_rank.setdefault(rank, []).append(param)
        rank = sorted(by_rank)[0]
        gt = recs[rank]['gt_boxes']
        summary = (f'{_where(rec)}: {_ranks(sorted(by_rank))} gave no '
                   f'gradient to {group_param_names(by_rank[rank])} '
                   f'({gt} GT boxes on rank {rank})')
        if setup.auto_ddp:
            on_gpus = (f'AutoDDP ({mode or "static"} after its first step) '
                       f'stops rank {rank} in iteration {k} with '
                       'UnexpectedUnusedParameterError; its peers wait in '
                       'the gradient all-reduce until the collective '
                       'timeout.')
        elif all(len(r) == world for r in missing.values()):
            on_gpus = (f'every rank fails at iteration {k + 1} with '
                       f'{STOCK_UNUSED_CRASH}.')
        else:
            on_gpus = (f'NCCL hangs in iteration {k}: the ranks that '
                       'computed these gradients wait in their bucket\'s '
                       f'all-reduce; rank {rank} fails at iteration {k + 1} '
                       f'with {STOCK_UNUSED_CRASH}.')
        fix = (EMPTY_GT_FIX if gt == 0 else []) + [
            "model_wrapper_cfg = dict(type='AutoDDP', "
            'find_unused_parameters=True)']
        return Check(
            PHASE, name, BLOCKER, summary, on_gpus=on_gpus, fix=fix,
            details=dict(iteration=k, rank=rank, parameters=by_rank[rank],
                         autoddp_mode=mode))
    return Check(PHASE, name, OK,
                 'every parameter DDP synchronises got a gradient on every '
                 'rank in every iteration' +
                 (f' (AutoDDP decides {mode!r})' if deciding else ''))


def _owning_modules(names: List[str], sites: List[str]) -> List[str]:
    owners = []
    for name in names:
        site = max((s for s in sites if name.startswith(s + '.')),
                   key=len, default=name.rpartition('.')[0])
        if site not in owners:
            owners.append(site)
    return owners


def check_checkpointing(iters: List[List[dict]], setup: DDPSetup,
                        trainable: List[str], sites: List[str],
                        changed: List[str]) -> Check:
    name = 'checkpointing and DDP'
    deciding = setup.auto_ddp and setup.find_unused is None
    flag = (autoddp_decision(iters[0], trainable) == 'find_unused'
            if deciding else bool(setup.find_unused))
    for recs in iters:
        hidden = sorted({n for rec in recs for n in rec['hidden_from_ddp']})
        if not hidden:
            continue
        modules = _owning_modules(hidden, sites)
        if not flag:
            return Check(
                PHASE, name, OK,
                f'{len(modules)} module(s) checkpoint reentrantly '
                f"({', '.join(modules[:6])}); harmless with "
                'find_unused_parameters=False.',
                details=dict(modules=modules))
        k = recs[0]['iteration']
        return Check(
            PHASE, name, BLOCKER,
            f'reentrant activation checkpointing hides the parameters of '
            f"{', '.join(modules)} from DDP's unused-parameter search "
            '(find_unused_parameters=True)',
            on_gpus=f'every rank fails in the backward of iteration {k} '
            f'with {READY_TWICE}.',
            fix=OPT_IN_FIX + [
                "custom_hooks = [dict(type='CheckpointConflictHook', "
                "policy='non_reentrant')]  # keeps the memory savings"
            ],
            details=dict(iteration=k, modules=modules, parameters=hidden))
    return Check(PHASE, name, OK,
                 'no parameter is hidden from DDP by reentrant '
                 'checkpointing' + (f' ({len(changed)} site(s) changed by '
                                    f"CheckpointConflictHook's policy "
                                    f"'{setup.checkpoint_policy}')"
                                    if changed else ''))


def check_nonfinite(iters: List[List[dict]], setup: DDPSetup) -> Check:
    name = 'non-finite values'
    for recs in iters:
        bad = [(r, rec['nonfinite_losses'] + rec['nonfinite_grads'])
               for r, rec in enumerate(recs)
               if rec['nonfinite_losses'] or rec['nonfinite_grads']]
        if not bad:
            continue
        rank, keys = bad[0]
        rec = recs[rank]
        verdict = WARN if setup.rank_consistency else BLOCKER
        on_gpus = ('RankConsistencyHook skips the step on every rank; '
                   'training stops after 5 such steps in a row.'
                   if setup.rank_consistency else
                   'the gradient all-reduce spreads NaN/inf to every rank '
                   f"from iteration {rec['iteration']} on.")
        return Check(
            PHASE, name, verdict,
            f"{_where(rec)}: rank {rank} has non-finite "
            f"{', '.join(keys[:6])} ({rec['gt_boxes']} GT boxes)",
            on_gpus=on_gpus,
            fix=["# for varifocal losses: loss_cls=dict(type="
                 "'SafeVarifocalLoss', ...)"] + OPT_IN_FIX,
            details=dict(iteration=rec['iteration'], rank=rank, keys=keys))
    return Check(PHASE, name, OK, 'every loss and gradient is finite')


def check_cost(iters: List[List[dict]]) -> Check:
    times = [[rec['step_time_s'] for rec in recs] for recs in iters]
    memory = max(rec['peak_memory_mb'] for recs in iters for rec in recs)
    mean = sum(map(sum, times)) / max(1, sum(map(len, times)))
    return Check(
        PHASE, 'step time and memory', OK,
        f'mean step {mean:.2f} s, peak memory {memory:.0f} MiB per rank '
        '(CPU figures: relative only)',
        details=dict(step_time_s=times, peak_memory_mb=memory))


def dynamic_checks(results: Sequence[dict], setup: DDPSetup,
                   trainable: List[str]) -> List[Check]:
    """Every dynamic verdict from the ranks' records (in rank order)."""
    iters = _per_iteration(results)
    sites = list(results[0].get('checkpoint_sites') or [])
    changed = list(results[0].get('checkpoint_changed') or [])
    return [
        check_errors(iters),
        check_loss_keys(iters, setup),
        check_collectives(iters, setup),
        check_unused(iters, setup, trainable),
        check_usage(iters, setup, trainable),
        check_checkpointing(iters, setup, trainable, sites, changed),
        check_nonfinite(iters, setup),
        check_cost(iters),
    ]


def gradient_check(result: Optional[Dict[str, Any]]) -> Check:
    """The verdict of the gradient comparison (rank 0's result)."""
    from .gradients import __doc__ as explanation
    name = 'gradient equivalence'
    if not result or 'relative_error' not in result:
        return Check('gradients', name, WARN, 'not run')
    errors = result['relative_error']
    tolerance = result['tolerance']
    worst = max(errors, key=errors.get)
    notes = []
    shapes = result['padded_shapes']
    if any(s != shapes['whole'] for s in shapes['ranks']):
        notes.append(f"images are padded differently (ranks: "
                     f"{shapes['ranks']}, one process: {shapes['whole']}): "
                     'an expected difference')
    if result['diverged']:
        notes.append('the ranks diverged in the comparison step; see the '
                     'collectives check')
    details = dict(result, explanation=' '.join(explanation.split()))
    if errors[worst] <= tolerance:
        return Check(
            'gradients', name, OK,
            f'N ranks match one process over the concatenated batch: '
            f"largest relative error {errors[worst]:.1e} ({worst}), "
            f'tolerance {tolerance:.0e}', details=details)
    return Check(
        'gradients', name, WARN,
        f'relative error up to {errors[worst]:.1e} in {worst} (tolerance '
        f'{tolerance:.0e}). ' + ('; '.join(notes) + '. ' if notes else '') +
        'With noise, dropout, BatchNorm statistics and denoising-group '
        'sizes held equal, a remaining difference points to a loss '
        'normalised by a local count, or a term computed on some ranks '
        'only.',
        on_gpus='trains, but not as the same model on one GPU with the '
        'whole batch would.',
        details=details)
