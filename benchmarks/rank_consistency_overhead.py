"""Step time with RankConsistencyHook's and NonFiniteSkipHook's work on vs
off, side by side.

    python benchmarks/rank_consistency_overhead.py [--groups 12]
                                                   [--repeats 2]

Runs tiny DINO training on 2 gloo ranks (CPU) with RankConsistencyHook
and NonFiniteSkipHook registered and switches, step by step, what the
hooks do:
  off      nothing (their wrappers still run: a few microseconds)
  every    the consistency check and the non-finite flag all-reduce in
           every iteration (check_every=1)
  default  the default schedule after its first 10 iterations: the flag
           all-reduce every iteration, the check every 50th
Each batch is trained on 6 times in a row, every mode twice in a mirrored
rotation (off every default default every off, every default off off
default every, ...: ``_common.same_batch_mode``), so every comparison is
between steps on the same images a few seconds apart. That cancels the
load drift of a shared machine and the step time's dependence on the
batch (its boxes set the denoising queries).
Prints the step-time ratio of each mode to off (median over the
batches, after --warmup-groups, with a 90 % bootstrap interval) and the
median time rank 0 spent inside the hooks per step (fingerprint check,
flag all-reduce, its wait at the step): wall time, which includes waiting
for the slower rank at a check (time DDP's all-reduce would otherwise
wait), and this thread's CPU time, the hook's own work.
"""
import argparse
import time

from _common import (REPO_ROOT, TIMED_RUN_OVERRIDES, StepTimer,  # noqa
                     make_dataset, median, mode_medians,
                     register_same_batch_sampler, same_batch_mode,
                     same_batch_overrides, same_batch_ratios)

# mode: (RankConsistencyHook settings, NonFiniteSkipHook on)
MODES = {
    'off': (dict(check_first=0, check_every=10**9), False),
    'every': (dict(check_first=0, check_every=1), True),
    'default': (dict(check_first=0, check_every=50), True),
}
GROUP = 2 * len(MODES)  # steps per batch
TIMED_METHODS = {
    'RankConsistencyHook': ('_check_fingerprints', ),
    'NonFiniteSkipHook': ('_reduce_nonfinite_flags', '_nonfinite_ranks'),
}


def _time_hook(hook, wall, cpu):
    """Add the wall and CPU time of the hook's per-iteration work to the
    current (last) entries of ``wall`` and ``cpu``."""
    for name in TIMED_METHODS[type(hook).__name__]:
        method = getattr(hook, name)

        def timed(*args, _method=method, **kwargs):
            start_wall, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                wall[-1] += time.perf_counter() - start_wall
                cpu[-1] += time.thread_time() - start_cpu

        setattr(hook, name, timed)


def _time_run(work_dir, data_root, iters):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from mmddp_ext.hooks import NonFiniteSkipHook, RankConsistencyHook
    from tests.helpers import build_runner
    register_same_batch_sampler()
    runner = build_runner(
        work_dir, data_root, iters, {
            'mmddp_ext_cfg.rank_consistency': None,
            'mmddp_ext_cfg.nonfinite_skip': None,
            'custom_hooks': [
                dict(type='RankConsistencyHook'),
                dict(type='NonFiniteSkipHook')
            ],
            **TIMED_RUN_OVERRIDES,
            **same_batch_overrides(list(MODES)),
        })
    consistency = next(
        h for h in runner.hooks if isinstance(h, RankConsistencyHook))
    skip = next(h for h in runner.hooks if isinstance(h, NonFiniteSkipHook))
    modes, wall, cpu = [], [], []
    _time_hook(consistency, wall, cpu)
    _time_hook(skip, wall, cpu)
    reduce_flags = skip._reduce_nonfinite_flags

    class SwitchMode(Hook):
        priority = 'HIGHEST'  # before the hooks decide

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            mode = same_batch_mode(runner.iter, list(MODES))
            settings, skipping = MODES[mode]
            for key, value in settings.items():
                setattr(consistency, key, value)
            # Off: no flag all-reduce, so the step has no flags to wait on.
            skip._reduce_nonfinite_flags = (
                reduce_flags if skipping else lambda parsed_loss: None)
            modes.append(mode)
            wall.append(0.0)
            cpu.append(0.0)

    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(SwitchMode())
    runner.register_hook(timer)
    runner.train()
    if dist.get_rank() != 0:
        return None
    return modes, timer.times, wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--groups',
        type=int,
        default=12,
        help=f'measured batches per run, each trained on {GROUP} times')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--warmup-groups', type=int, default=2)
    args = parser.parse_args()

    import tempfile

    from mmddp_ext.testing import run_on_ranks
    data_root = make_dataset()
    records = []  # ((run, group), mode, seconds)
    in_wall = {name: [] for name in MODES}
    in_cpu = {name: [] for name in MODES}
    iters = (args.warmup_groups + args.groups) * GROUP
    for repeat in range(args.repeats):
        modes, times, wall, cpu = run_on_ranks(
            _time_run,
            2,
            args=(tempfile.mkdtemp(), data_root, iters),
            timeout=1800,
            env={'OMP_NUM_THREADS': '1'})[0]
        skip = args.warmup_groups * GROUP
        this = []  # (group, mode, seconds)
        for i, (mode, step, w, c) in enumerate(zip(modes, times, wall, cpu)):
            if i < skip:
                continue
            this.append((i // GROUP, mode, step))
            in_wall[mode].append(w)
            in_cpu[mode].append(c)
        records += [((repeat, g), m, t) for g, m, t in this]
        medians = mode_medians(this, MODES)
        ratios = {
            name: same_batch_ratios(this, name, 'off')[0]
            for name in ('every', 'default')
        }
        print(f'repeat {repeat}: median step ' +
              ', '.join(f'{name} {medians[name] * 1e3:.1f} ms'
                        for name in MODES) + '; / off: ' +
              ', '.join(f'{name} {ratio:.3f}'
                        for name, ratio in ratios.items()),
              flush=True)
    off = mode_medians(records, MODES)['off']
    print('\n== RankConsistencyHook + NonFiniteSkipHook overhead (2 gloo '
          'ranks, CPU, tiny DINO, same batches interleaved) ==')
    for name in ('every', 'default'):
        ratio, low, high, groups = same_batch_ratios(records, name, 'off')
        print(f'{name:8s} / off: step time {ratio:.3f}, 90 % interval '
              f'[{low:.3f}, {high:.3f}] over {groups} batches; in the hooks '
              f'{median(in_wall[name]) / off * 100:.2f} % of a step (wall), '
              f'{median(in_cpu[name]) / off * 100:.2f} % (CPU)')


if __name__ == '__main__':
    main()
