"""Turn the per-rank probe records into verdicts.

Each iteration is read once (:func:`analyse`): which ranks raised, and
whether the exception is the user's (the config's code raised it in a
step a real launch runs), the doctor's (its own code raised it) or a
consequence (the ranks had already diverged, and the rest of the
iteration ran with single-process semantics); whether the loss keys and
the collectives differ; and what DDP on N GPUs makes of it
(:func:`.ddp_outcome.predict`). A finding is reported once, under the
check of its cause: an iteration whose ranks crashed is not read again
for unused parameters, collectives that differ because the loss keys do
are part of the loss-key finding, and an exception every rank raises in
an iteration whose ranks already differ (``RankConsistencyHook``'s
``RankDivergenceError``) is what the difference does, not a second
finding. Each verdict names its evidence (rank, iteration, key,
collective, parameter, traceback), what happens on N GPUs, and a fix to
paste; each ok names the iterations it covers.
"""
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..utils.text import group_param_names, more_text, ranks_text
from .ddp_outcome import Context, Outcome, predict
from .report import BLOCKER, DOCTOR_ERROR, OK, WARN, Check

PHASE = 'dynamic'
MMDDP_EXT_IMPORT = ("custom_imports = dict(imports=['mmddp_ext'], "
                    'allow_failed_imports=False)')
OPT_IN_FIX = [
    "_base_ = ['./your_config.py', "
    "'<mmddp_ext>/configs/_base_/mmddp_ext.py']",
]
AUTODDP_FIX = ["model_wrapper_cfg = dict(type='AutoDDP')", MMDDP_EXT_IMPORT]
CONSISTENCY_FIX = ("custom_hooks = [dict(type='RankConsistencyHook')]  # "
                   'every rank stops with an error naming the difference, '
                   'no hang')
READY_TWICE = "'Expected to mark a variable ready only once'"


@dataclass
class FixContext:
    """What the paste lines depend on.

    Args:
        ddp_safe_types (tuple[str, str] | None): For a detector of mmdet's
            DINO family, the registered names of the DDP-safe detector and
            head classes this package ships that the config's own classes
            derive from (nearest in their MRO; ``DDPSafeDINO`` /
            ``DDPSafeDINOHead`` for mmdet's own): what keeps the denoising
            part on a rank without GT. None for other detectors, or when
            the config already uses exactly those classes.
        import_line (str | None): The ``custom_imports`` line to paste
            with a fix that uses mmddp_ext's types; None when the config
            already imports mmddp_ext.
    """
    ddp_safe_types: Optional[Tuple[str, str]] = None
    import_line: Optional[str] = MMDDP_EXT_IMPORT

    def with_import(self, lines: List[str]) -> List[str]:
        return lines + ([self.import_line] if self.import_line else [])

    def empty_gt(self) -> List[str]:
        if self.ddp_safe_types:
            detector, head = self.ddp_safe_types
            line = (f"model = dict(type='{detector}', "
                    f"bbox_head=dict(type='{head}'))")
        else:
            line = ("train_dataloader = dict(collate_fn=dict("
                    "type='empty_gt_guard_collate', policy='swap'))")
        return self.with_import([line])


@dataclass
class Analysis:
    """One iteration, every rank: see the module docstring."""
    k: int
    recs: List[dict]
    user_failed: Dict[int, dict] = field(default_factory=dict)
    doctor_failed: Dict[int, dict] = field(default_factory=dict)
    keys_differ: bool = False
    reaction: bool = False
    outcome: Optional[Outcome] = None

    @property
    def crashed(self) -> bool:
        """An exception of the user's code is this iteration's cause."""
        return bool(self.user_failed) and not self.reaction


def _per_iteration(results: Sequence[dict]) -> List[List[dict]]:
    iters = min(len(r['iterations']) for r in results)
    return [[r['iterations'][k] for r in results] for k in range(iters)]


def horizon(iters: int, epoch: int) -> str:
    """The iterations an ok covers."""
    return (f'iterations 0-{iters - 1} of epoch {epoch} (later ones not '
            'checked)')


def beyond(iters: int) -> str:
    return (f'what changes after iteration {iters - 1} (a parameter going '
            'unused, a loss key, a collective, e.g. from a later epoch\'s '
            'hook or a rarer batch) is outside what was checked')


def analyse(iters: List[List[dict]], ctx: Context) -> List[Analysis]:
    analyses = []
    for k, recs in enumerate(iters):
        item = Analysis(k, recs)
        for rank, rec in enumerate(recs):
            error = rec['error']
            if error is None or error['after_divergence']:
                continue
            if error['doctor']:
                item.doctor_failed[rank] = error
            else:
                item.user_failed[rank] = error
        healthy = [tuple(rec['loss_keys']) for rank, rec in enumerate(recs)
                   if rank not in item.user_failed]
        item.keys_differ = len(set(healthy)) > 1
        errors = list(item.user_failed.values())
        all_keys = [tuple(rec['loss_keys']) for rec in recs]
        # Every rank raised the same exception at the same point, after
        # their records already differed: the config's reaction to it.
        item.reaction = (
            len(errors) == len(recs)
            and len({(e['type'], e['phase']) for e in errors}) == 1
            and (len(set(all_keys)) > 1 or any(
                rec['divergence'] and not any(
                    m.startswith('<error') for m in rec['divergence']
                    ['per_rank']) for rec in recs)))
        if item.reaction:
            item.keys_differ = len(set(all_keys)) > 1
        item.outcome = predict(k, recs, ctx, item.user_failed)
        analyses.append(item)
    return analyses


def _first_frame(traceback_text: str) -> str:
    """The innermost ``File "...", line N, in f`` line of a traceback."""
    frames = [
        line.strip() for line in traceback_text.splitlines()
        if line.strip().startswith('File "')
    ]
    return frames[-1] if frames else 'unknown location'


def check_setup(results: Sequence[dict], ctx: Context, iters: int) -> Check:
    first = results[0]
    hooks = first.get('hooks', [])
    summary = (
        f"the config's {first.get('runner')} ran {first.get('loop')} with "
        f'its {len(hooks)} hooks, data preprocessor and collate function '
        f'over iterations 0-{iters - 1} of epoch {first.get("epoch", 0)}; '
        f'{beyond(iters)}. CPU twins: '
        f"{'; '.join(first.get('twins', []))}. The step is the probe's: "
        'forward and backward per rank without DDP, gradients averaged as '
        'DDP averages them, then the config\'s optimizer step')
    changed = first.get('checkpoint_changed') or []
    if changed:
        summary += (f"; CheckpointConflictHook's policy "
                    f"'{ctx.setup.checkpoint_policy}' applied up front to "
                    f'{len(changed)} checkpointing module(s)')
    return Check(PHASE, 'how the probe ran', OK, summary,
                 details=dict(hooks=hooks, twins=first.get('twins', [])))


def check_doctor_errors(analyses: List[Analysis]) -> List[Check]:
    found = [(a.k, rank, error) for a in analyses
             for rank, error in sorted(a.doctor_failed.items())]
    if not found:
        return []
    k, rank, error = found[0]
    return [
        Check(
            'doctor', 'probe', DOCTOR_ERROR,
            f"the doctor's own code raised on rank {rank} in the "
            f"{error['phase']} of iteration {k}: {error['type']}: "
            f"{error['message'].splitlines()[0][:300]} "
            f"({_first_frame(error['traceback'])}). A real launch does not "
            'run this code; this says nothing about the config.',
            fix=['# please report it to mmddp_ext with this traceback'],
            details=dict(iteration=k, rank=rank, error=error,
                         traceback=error['traceback']))
    ]


def check_errors(analyses: List[Analysis], iters: int, epoch: int) -> Check:
    for item in analyses:
        if not item.crashed:
            continue
        rank = min(item.user_failed)
        error = item.user_failed[rank]
        rec = item.recs[rank]
        return Check(
            PHASE, 'runs on every rank', BLOCKER,
            f"{ranks_text(sorted(item.user_failed))} raised in the "
            f"{error['phase']} of iteration {item.k} ({rec['kind']}, "
            f"{rec['gt_boxes']} GT boxes on rank {rank}): {error['type']}: "
            f"{error['message'].splitlines()[0][:300]}, at "
            f"{_first_frame(error['traceback'])}",
            on_gpus=item.outcome.text,
            fix=[
                "# the config's code raised at "
                f"{_first_frame(error['traceback'])}"
                ' (traceback below); the same step runs in '
                'tools/train.py CONFIG'
            ],
            details=dict(
                iteration=item.k,
                rank=rank,
                ranks=sorted(item.user_failed),
                error=f"{error['type']}: {error['message']}",
                phase=error['phase'],
                traceback=error['traceback']))
    return Check(PHASE, 'runs on every rank', OK,
                 'every rank ran without an exception in '
                 f'{horizon(iters, epoch)}')


def _reference(key_sets: List[tuple]) -> tuple:
    counts = Counter(key_sets)
    return max(key_sets, key=lambda s: (counts[s], -key_sets.index(s)))


def _key_lines(item: Analysis):
    key_sets = [tuple(rec['loss_keys']) for rank, rec in enumerate(item.recs)
                if rank not in item.user_failed or item.reaction]
    reference = _reference(key_sets)
    lines, first = [], None
    for rank, rec in enumerate(item.recs):
        if rank in item.user_failed and not item.reaction:
            continue
        keys = set(rec['loss_keys'])
        extra = sorted(keys - set(reference))
        missing = sorted(set(reference) - keys)
        if not (extra or missing):
            continue
        first = first or dict(rank=rank, extra=extra, missing=missing,
                              gt_boxes=rec['gt_boxes'])
        parts = ([f"has extra loss key(s) {', '.join(extra)}"] if extra else
                 []) + ([f"lacks {', '.join(missing)}"] if missing else [])
        lines.append(f"rank {rank} {' and '.join(parts)} "
                     f"({rec['gt_boxes']} GT boxes in its batch)")
    return lines, first, reference


def check_loss_keys(analyses: List[Analysis], fixes: FixContext, iters: int,
                    epoch: int) -> Check:
    for item in analyses:
        if not item.keys_differ or item.crashed:
            continue
        lines, first, reference = _key_lines(item)
        rec = item.recs[first['rank']]
        evidence = (f"iteration {item.k} ({rec['kind']}): " +
                    '; '.join(lines) +
                    f' (the others have {len(reference)} keys)')
        fix = (fixes.empty_gt() if first['gt_boxes'] == 0 else [
            '# compute every loss term on every rank, with zero weight '
            'where it does not apply'
        ] + fixes.with_import([CONSISTENCY_FIX]))
        details = dict(iteration=item.k, mechanism=item.outcome.mechanism,
                       **first)
        if item.outcome.fails:
            return Check(PHASE, 'loss keys', BLOCKER, evidence,
                         on_gpus=item.outcome.text, fix=fix, details=details)
        return Check(
            PHASE, 'loss keys', WARN, evidence + '; the graphs still reach '
            'the same parameters and the collectives match',
            on_gpus='trains: DDP sees the same gradients and collectives on '
            'every rank, but the loss differs by rank, so the averaged '
            'gradient is not that of one process over the whole batch.',
            fix=fix, details=details)
    return Check(PHASE, 'loss keys', OK,
                 f'every rank produced the same loss keys in '
                 f'{horizon(iters, epoch)}')


def _covered(item: Analysis) -> Optional[str]:
    """The check that reports this iteration's cause, if another one."""
    if item.crashed:
        return 'runs on every rank'
    if item.keys_differ:
        return 'loss keys'
    return None


def check_collectives(analyses: List[Analysis], fixes: FixContext,
                      iters: int, epoch: int) -> Check:
    notes = []
    for item in analyses:
        divergence = next((rec['divergence'] for rec in item.recs
                           if rec['divergence']), None)
        if divergence is None:
            continue
        covered = _covered(item)
        if covered:
            notes.append(f'iteration {item.k}: they differ as a consequence, '
                         f'see {covered}')
            continue
        marks = '; '.join(f'rank {r}: {m}'
                          for r, m in enumerate(divergence['per_rank']))
        return Check(
            PHASE, 'collectives', BLOCKER,
            f"iteration {item.k}, {divergence['phase']} collective "
            f"#{divergence['index'] + 1} differs: {marks}",
            on_gpus=item.outcome.text if item.outcome.mechanism
            == 'collectives' else item.outcome.text,
            fix=['# issue every collective (reduce_mean of a loss '
                 'normaliser, ...) unconditionally, on every rank'] +
            fixes.with_import([CONSISTENCY_FIX]),
            details=dict(iteration=item.k, **divergence))
    counts = ([len(rec['collectives']) for rec in analyses[0].recs]
              if analyses else [0])
    calls = Counter(e['call'] for e in analyses[0].recs[0]['collectives']
                    ) if analyses else Counter()
    common = ', '.join(f'{c} x{n}' for c, n in calls.most_common(3))
    return Check(
        PHASE, 'collectives', OK,
        f'every rank issued the same collectives in '
        f'{horizon(iters, epoch)} ({counts[0]} in iteration 0'
        f'{": " + common if common else ""})' +
        (' (' + '; '.join(notes) + ')' if notes else ''))


def _never_used(recs: List[dict], trainable: List[str]) -> List[str]:
    world = len(recs)
    counts = Counter(n for rec in recs for n in rec['no_grad'])
    return [n for n in trainable if counts[n] == world]


def check_unused(analyses: List[Analysis], ctx: Context,
                 fixes: FixContext) -> Check:
    name = 'unused parameters'
    clean = [a for a in analyses if not a.user_failed]
    if not clean:
        return Check(PHASE, name, WARN, 'not checked: every iteration '
                     'raised (see runs on every rank)')
    item = clean[0]
    never = _never_used(item.recs, ctx.trainable)
    where = f'iteration {item.k}'
    if not never:
        return Check(PHASE, name, OK,
                     'every trainable parameter received a gradient on some '
                     f'rank in {where}')
    listed = group_param_names(never)
    details = dict(parameters=never, iteration=item.k)
    setup = ctx.setup
    if setup.auto_ddp and setup.find_unused is None:
        return Check(
            PHASE, name, OK,
            f'{len(never)} parameter(s) get no gradient on any rank in '
            f'{where} ({listed}); AutoDDP leaves them out of DDP and keeps '
            'the fast path.', details=details)
    if setup.find_unused:
        return Check(
            PHASE, name, WARN,
            f'{len(never)} parameter(s) get no gradient on any rank in '
            f'{where} ({listed}); find_unused_parameters=True copes, at the '
            'cost of a graph traversal every iteration.',
            on_gpus='trains, slower than needed.', fix=AUTODDP_FIX,
            details=details)
    who = ('AutoDDP (find_unused_parameters=False)' if setup.auto_ddp else
           f'{setup.wrapper} with find_unused_parameters=False')
    outcome = predict(item.k, item.recs, replace(ctx, excluded=[]), {})
    return Check(
        PHASE, name, BLOCKER,
        f'{len(never)} parameter(s) get no gradient on any rank in {where}: '
        f'{listed}. {who} needs every parameter in the loss. Use AutoDDP: '
        'it finds them in its first step and leaves them out of DDP.',
        on_gpus=outcome.text,
        fix=OPT_IN_FIX + ['# or, without the rest of mmddp_ext:'] +
        fixes.with_import(AUTODDP_FIX[:1]),
        details=details)


def check_usage(analyses: List[Analysis], ctx: Context, fixes: FixContext,
                iters: int, epoch: int) -> Check:
    """Parameters whose gradient depends on the rank or the iteration,
    against the flag DDP runs with."""
    name = 'gradients on every rank'
    deciding = ctx.autoddp_mode is not None
    if ctx.find_unused:
        return Check(PHASE, name, OK,
                     'find_unused_parameters=True' +
                     (" (AutoDDP's decision)" if deciding else '') +
                     ': DDP copes with parameters used on some ranks only')
    notes = []
    for item in analyses:
        outcome = item.outcome
        if outcome.mechanism not in ('buckets', 'autoddp'):
            continue
        covered = _covered(item)
        if covered:
            notes.append(f'iteration {item.k}: see {covered}')
            continue
        rank = outcome.details['rank']
        never = set(_never_used(item.recs, ctx.trainable))
        missing = {r: [n for n in m if n not in never]
                   for r, m in outcome.details['missing'].items()}
        if not any(missing.values()):
            continue  # reported by the unused-parameters check
        rec = item.recs[rank]
        fix = (fixes.empty_gt() if rec['gt_boxes'] == 0 else []) + \
            fixes.with_import([
                "model_wrapper_cfg = dict(type='AutoDDP', "
                'find_unused_parameters=True)'])
        return Check(
            PHASE, name, BLOCKER,
            f"iteration {item.k} ({rec['kind']}): "
            f'{ranks_text(sorted(r for r, m in missing.items() if m))} gave '
            f'no gradient to {group_param_names(missing[rank] or never)} '
            f"({rec['gt_boxes']} GT boxes on rank {rank})",
            on_gpus=outcome.text, fix=fix,
            details=dict(iteration=item.k, rank=rank,
                         parameters=missing[rank],
                         autoddp_mode=ctx.autoddp_mode))
    return Check(
        PHASE, name, OK,
        'every parameter DDP synchronises got a gradient on every rank in '
        f'{horizon(iters, epoch)}' +
        (f' (AutoDDP decides {ctx.autoddp_mode!r})' if deciding else '') +
        (' (' + '; '.join(notes) + ')' if notes else '') +
        f'; {beyond(iters)}')


def _owning_modules(names: List[str], sites: List[str]) -> List[str]:
    owners = []
    for name in names:
        site = max((s for s in sites if name.startswith(s + '.')),
                   key=len, default=name.rpartition('.')[0])
        if site not in owners:
            owners.append(site)
    return owners


def check_checkpointing(analyses: List[Analysis], ctx: Context,
                        sites: List[str], changed: List[str],
                        fixes: FixContext) -> Check:
    name = 'checkpointing and DDP'
    for item in analyses:
        hidden = sorted({n for rec in item.recs
                         for n in rec['hidden_from_ddp']})
        if not hidden or item.crashed:
            continue
        modules = _owning_modules(hidden, sites)
        if not ctx.find_unused:
            return Check(
                PHASE, name, OK,
                f'{len(modules)} module(s) checkpoint reentrantly '
                f"({', '.join(modules[:6])}); harmless with "
                'find_unused_parameters=False.',
                details=dict(modules=modules))
        return Check(
            PHASE, name, BLOCKER,
            f'iteration {item.k}: reentrant activation checkpointing hides '
            f"the parameters of {', '.join(modules)} from DDP's "
            'unused-parameter search (find_unused_parameters=True)',
            on_gpus=f'every rank fails in the backward of iteration '
            f'{item.k} with {READY_TWICE}: DDP marks them ready as unused '
            'after the forward, then again when the recomputation computes '
            'their gradients.',
            fix=OPT_IN_FIX + fixes.with_import([
                "custom_hooks = [dict(type='CheckpointConflictHook', "
                "policy='non_reentrant')]  # keeps the memory savings"
            ]),
            details=dict(iteration=item.k, modules=modules,
                         parameters=hidden))
    return Check(PHASE, name, OK,
                 'no parameter is hidden from DDP by reentrant '
                 'checkpointing' + (f' ({len(changed)} site(s) changed by '
                                    f"CheckpointConflictHook's policy "
                                    f"'{ctx.setup.checkpoint_policy}')"
                                    if changed else ''))


def check_nonfinite(analyses: List[Analysis], iters: int,
                    epoch: int) -> Check:
    name = 'non-finite values'
    for item in analyses:
        bad = [(r, rec['nonfinite_losses'] + rec['nonfinite_grads'])
               for r, rec in enumerate(item.recs)
               if rec['nonfinite_losses'] or rec['nonfinite_grads']]
        if not bad or item.crashed:
            continue
        rank, keys = bad[0]
        rec = item.recs[rank]
        step = item.recs[0].get('nonfinite_step')
        evidence = (f"iteration {item.k} ({rec['kind']}): rank {rank} has "
                    f"non-finite {', '.join(keys[:6])} ({rec['gt_boxes']} "
                    'GT boxes)')
        details = dict(iteration=item.k, rank=rank, keys=keys, step=step)
        fix = ["# for varifocal losses: loss_cls=dict(type="
               "'SafeVarifocalLoss', ...)"] + OPT_IN_FIX
        if step == 'skipped':
            return Check(
                PHASE, name, WARN, evidence,
                on_gpus='the averaged gradient is non-finite on every rank; '
                "this config's optimizer step (with its hooks) left the "
                f'weights unchanged on every rank in iteration {item.k} '
                '(observed), so training goes on.',
                fix=fix, details=details)
        return Check(
            PHASE, name, BLOCKER, evidence,
            on_gpus='DDP\'s all-reduce spreads the non-finite gradient to '
            "every rank, and this config's optimizer step "
            + ('made the weights non-finite (observed)' if step ==
               'nonfinite weights' else 'applied it (observed)') +
            f' in iteration {item.k}: every later step is lost.',
            fix=fix, details=details)
    return Check(PHASE, name, OK, 'every loss and gradient is finite in '
                 f'{horizon(iters, epoch)}')


def check_cost(iters: List[List[dict]]) -> Check:
    times = [[rec['step_time_s'] for rec in recs] for recs in iters]
    memory = max(rec['peak_memory_mb'] for recs in iters for rec in recs)
    mean = sum(map(sum, times)) / max(1, sum(map(len, times)))
    return Check(
        PHASE, 'step time and memory', OK,
        f'mean step {mean:.2f} s, peak memory {memory:.0f} MiB per rank '
        '(CPU figures: relative only)',
        details=dict(step_time_s=times, peak_memory_mb=memory))


def autoddp_decision(recs: List[dict], trainable: List[str]) -> str:
    """AutoDDP's mode after its probe step on ``recs`` (see ``AutoDDP``:
    a parameter used on some ranks only means ``find_unused``, one used on
    none is left out)."""
    world = len(recs)
    counts = Counter(n for rec in recs for n in rec['no_grad'])
    missing = {n: counts[n] for n in trainable if counts[n]}
    if any(c < world for c in missing.values()):
        return 'find_unused'
    return 'ignore_unused' if missing else 'static'


def context(results: Sequence[dict], setup, trainable: List[str],
            timeout_s: float) -> Context:
    """The prediction context: AutoDDP's decision on the first iteration
    in which no rank raised."""
    iters = _per_iteration(results)
    ctx = Context(
        setup=setup,
        trainable=trainable,
        timeout_s=timeout_s,
        hooks=list(results[0].get('hooks', [])),
        first_bucket=results[0].get('first_bucket', 'float32[?]'))
    clean = [k for k, recs in enumerate(iters)
             if not any(rec['error'] for rec in recs)]
    if not clean:
        return ctx
    never = _never_used(iters[clean[0]], trainable)
    if setup.auto_ddp and setup.find_unused is None:
        ctx.decision_iteration = clean[0]
        ctx.autoddp_mode = autoddp_decision(iters[clean[0]], trainable)
        if ctx.autoddp_mode == 'ignore_unused':
            ctx.ignored = never
    else:  # the unused-parameters check reports them
        ctx.excluded = never
    return ctx


def dynamic_checks(results: Sequence[dict], ctx: Context,
                   fixes: FixContext) -> List[Check]:
    """Every dynamic verdict from the ranks' records (in rank order)."""
    iters = _per_iteration(results)
    analyses = analyse(iters, ctx)
    count = len(iters)
    epoch = results[0].get('epoch', 0)
    sites = list(results[0].get('checkpoint_sites') or [])
    changed = list(results[0].get('checkpoint_changed') or [])
    return check_doctor_errors(analyses) + [
        check_setup(results, ctx, count),
        check_errors(analyses, count, epoch),
        check_loss_keys(analyses, fixes, count, epoch),
        check_collectives(analyses, fixes, count, epoch),
        check_unused(analyses, ctx, fixes),
        check_usage(analyses, ctx, fixes, count, epoch),
        check_checkpointing(analyses, ctx, sites, changed, fixes),
        check_nonfinite(analyses, count, epoch),
        check_cost(iters),
    ]


def gradient_check(result: Optional[Dict[str, Any]],
                   iterations_failed: Sequence[str] = ()) -> Check:
    """The verdict of the gradient comparison (rank 0's result);
    ``iterations_failed`` are the exception types the iterations raised
    (the comparison failing the same way is the config's error, reported
    there)."""
    name = 'gradient equivalence'
    if not result:
        return Check('gradients', name, WARN, 'not run')
    error = result.get('error')
    if error is not None:
        if error['type'] in iterations_failed and not error['doctor']:
            return Check('gradients', name, WARN,
                         f"not compared: the comparison step raised "
                         f"{error['type']} as the iterations did (see runs "
                         'on every rank)')
        return Check(
            'doctor', 'gradient comparison', DOCTOR_ERROR,
            f"the comparison step raised {error['type']}: "
            f"{error['message'].splitlines()[0][:300]} at "
            f"{_first_frame(error['traceback'])}; the iterations ran "
            'without it, so it comes from what the comparison changes (its '
            'batches, constant random draws, eval-mode dropout and '
            'BatchNorm): the doctor\'s set-up, not a launch\'s',
            fix=['# rerun with --no-gradients; please report it to '
                 'mmddp_ext with this traceback'],
            details=dict(error=error, traceback=error['traceback']))
    counts = result['box_counts']
    totals = [sum(c) for c in counts]
    batches = ' and '.join('+'.join(map(str, c)) for c in counts)
    what = (f'{len(counts)} ranks with {batches} boxes against one process '
            f'over the {sum(len(c) for c in counts)} images')
    if result.get('diverged'):
        return Check('gradients', name, WARN,
                     f'not compared: the ranks diverged in the comparison '
                     f'step ({what}); see the collectives check')
    errors = result['relative_error']
    tolerance = result['tolerance']
    worst = max(errors, key=errors.get)
    details = dict(result)
    if errors[worst] <= tolerance:
        summary = (f'{what}: largest relative error {errors[worst]:.1e} '
                   f'({worst}), tolerance {tolerance:.0e}')
        if len(set(totals)) == 1:
            return Check(
                'gradients', name, WARN, summary + '; but every rank held '
                f'{totals[0]} boxes, so a loss normalised by the local count '
                'would not show', fix=['# add images with several boxes to '
                                       'the train set'], details=details)
        return Check('gradients', name, OK, summary, details=details)
    return _difference(result, what, details)


def _difference(result: dict, what: str, details: dict) -> Check:
    """A difference above the tolerance: whose code makes it (see
    :mod:`.gradients`)."""
    name = 'gradient equivalence'
    errors, tolerance = result['relative_error'], result['tolerance']
    over = sorted((m for m, e in errors.items()
                   if e > tolerance and m != '(all)'),
                  key=lambda m: -errors[m])
    listed = ', '.join(f'{m} {errors[m]:.1e}' for m in over)
    terms = {k: e for k, e in result.get('loss_error', {}).items()
             if e > tolerance and k != 'loss'}
    shown = sorted(terms, key=lambda k: -terms[k])
    code = result.get('head_code', {})
    small = result.get('small_difference', tolerance)
    heads = [m for m in over if m in code]
    own = [m for m in heads if code[m]['files']]
    large = [m for m in (own or over) if errors[m] > small]
    evidence = (
        f'{what}: relative gradient errors above {tolerance:.0e}: {listed}.' +
        (f" Loss terms whose mean over the ranks differs from one process's "
         f"value: {', '.join(f'{k} {terms[k]:.1e}' for k in shown[:8])}"
         f"{' ' + more_text(len(shown) - 8) if len(shown) > 8 else ''}."
         if shown else ''))
    details.update(loss_terms=shown, heads=heads, own_code_heads=own)
    fix = [
        '# normalise by the count over every rank, as mmdet\'s DETR heads '
        'do:',
        'num_total_pos = reduce_mean(num_total_pos.new_tensor('
        '[num_total_pos])).clamp(min=1).item()  # from mmdet.utils import '
        'reduce_mean',
    ]
    shapes = result['padded_shapes']
    padded = any(s != shapes['whole'] for s in shapes['ranks'])
    if heads and not own:
        owners = '; '.join(f"{m} ({', '.join(code[m]['classes'])})"
                           for m in heads)
        return Check(
            'gradients', name, WARN,
            evidence + f' The heads that differ run only MMDetection\'s own '
            f'loss code: {owners}; it normalises these terms by counts of '
            'the local batch, as upstream trains it',
            on_gpus='trains as upstream does on N GPUs: each rank\'s images '
            'weigh by how many boxes its own batch holds, not as one process '
            'over the whole batch.', fix=fix, details=details)
    culprits = own or over[:1]
    if not large:
        return Check(
            'gradients', name, WARN,
            evidence + f' The difference is small (at most {small:.0e} in '
            f"{', '.join(culprits)}): padding, sampling or query groups "
            'sized by the local batch, or a weakly count-dependent term',
            on_gpus='trains; each rank\'s batch shapes its gradient a little '
            'differently from one process over the whole batch.',
            fix=fix, details=details)
    where = '; '.join(
        f"{m} ({', '.join(code[m]['classes'])}, code in "
        f"{', '.join(code[m]['files'][:3])})" if m in code else m
        for m in culprits)
    if padded:
        return Check(
            'gradients', name, WARN,
            evidence + f" The images are padded differently (ranks: "
            f"{shapes['ranks']}, one process: {shapes['whole']}), which "
            f'also changes the gradient; the difference is in {where}',
            fix=fix, details=details)
    return Check(
        'gradients', name, BLOCKER,
        evidence + f' Noise, dropout, BatchNorm statistics and '
        'denoising-group sizes are held equal; what remains comes from '
        f'{where}: a loss normalised by a count of the local batch, or a '
        'term computed on some ranks only',
        on_gpus='trains without an error, but the averaged gradient is not '
        f'that of one process over the whole batch ({listed}): each rank\'s '
        'images weigh by how many boxes its own batch holds.',
        fix=fix, details=details)


def error_types(results: Sequence[dict]) -> List[str]:
    return sorted({
        rec['error']['type']
        for r in results for rec in r['iterations'] if rec['error']
    })
