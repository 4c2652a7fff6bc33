"""Step time with RankConsistencyHook's work on vs off, side by side.

    python benchmarks/rank_consistency_overhead.py [--cycles 3] [--repeats 2]

Runs tiny DINO training on 2 gloo ranks (CPU) with RankConsistencyHook
registered and switches, iteration by iteration in rotation, what the hook
does:
  off      nothing (its wrappers still run: a few microseconds)
  every    the consistency check and the non-finite flag all-reduce in
           every iteration (check_every=1)
  default  the default schedule after its first 10 iterations: the flag
           all-reduce every iteration, the check every 50th
Interleaving within one run cancels the load drift of a shared machine,
which swamps differences between separate runs; 3 modes against the
dataset's 8-iteration cycle give every mode every batch equally often,
and every other run reverses the rotation.
Prints the step-time ratios per mode (after --warmup), paired by batch
(``_common.paired_ratio``: a DETR step's time depends mostly on whether
its batch has boxes, so a ratio of medians over a mix of batches is not
stable), and the median time rank 0 spent inside the hook per step
(fingerprint check, flag all-reduce, its wait at the step): wall time,
which includes waiting for the slower rank at a check (time DDP's
all-reduce would otherwise wait), and this thread's CPU time, the hook's
own work.
"""
import argparse
import time

from _common import (REPO_ROOT, StepTimer, make_dataset, median,  # noqa
                     paired_ratio)

MODES = {
    'off': dict(check_first=0, check_every=10**9, skip_nonfinite=False),
    'every': dict(check_first=0, check_every=1, skip_nonfinite=True),
    'default': dict(check_first=0, check_every=50, skip_nonfinite=True),
}
TIMED_METHODS = ('_check_fingerprints', '_reduce_nonfinite_flags',
                 '_nonfinite_ranks')
# Iterations per cycle of modes and batches (3 modes, 8 batches).
CYCLE = 24


def _time_hook(hook, wall, cpu):
    """Add the wall and CPU time of the hook's per-iteration work to the
    current (last) entries of ``wall`` and ``cpu``."""
    for name in TIMED_METHODS:
        method = getattr(hook, name)

        def timed(*args, _method=method, **kwargs):
            start_wall, start_cpu = time.perf_counter(), time.thread_time()
            try:
                return _method(*args, **kwargs)
            finally:
                wall[-1] += time.perf_counter() - start_wall
                cpu[-1] += time.thread_time() - start_cpu

        setattr(hook, name, timed)


def _time_run(work_dir, data_root, iters, order):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from mmddp_ext.hooks import RankConsistencyHook
    from tests.helpers import build_runner
    runner = build_runner(
        work_dir, data_root, iters, {
            'mmddp_ext_cfg.rank_consistency': None,
            'custom_hooks': [dict(type='RankConsistencyHook')],
            'default_hooks.logger.interval': 1000,
            'train_dataloader.sampler.shuffle': False,
        })
    consistency = next(
        h for h in runner.hooks if isinstance(h, RankConsistencyHook))
    modes, wall, cpu = [], [], []

    class SwitchMode(Hook):
        priority = 'HIGHEST'  # before RankConsistencyHook decides

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            mode = order[runner.iter % len(order)]
            for key, value in MODES[mode].items():
                setattr(consistency, key, value)
            modes.append(mode)
            wall.append(0.0)
            cpu.append(0.0)

    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(SwitchMode())
    runner.register_hook(timer)
    _time_hook(consistency, wall, cpu)
    runner.train()
    if dist.get_rank() != 0:
        return None
    return modes, timer.times, timer.batches, wall, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--cycles',
        type=int,
        default=3,
        help=f'measured iterations = cycles x {CYCLE}')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=12)
    args = parser.parse_args()

    import tempfile

    from mmddp_ext.testing import run_on_ranks
    data_root = make_dataset()
    steps = {name: ([], []) for name in MODES}  # times, batch indices
    in_wall = {name: [] for name in MODES}
    in_cpu = {name: [] for name in MODES}
    iters = args.warmup + args.cycles * CYCLE
    for repeat in range(args.repeats):
        # Every other run reverses the rotation, so that no mode always
        # follows the same other one.
        order = list(MODES)[::1 if repeat % 2 == 0 else -1]
        modes, times, batches, wall, cpu = run_on_ranks(
            _time_run,
            2,
            args=(tempfile.mkdtemp(), data_root, iters, order),
            timeout=1800,
            env={'OMP_NUM_THREADS': '1'})[0]
        for mode, step, batch, w, c in list(
                zip(modes, times, batches, wall, cpu))[args.warmup:]:
            steps[mode][0].append(step)
            steps[mode][1].append(batch)
            in_wall[mode].append(w)
            in_cpu[mode].append(c)
        print(
            f'repeat {repeat}: median step ' +
            ', '.join(f'{name} {median(steps[name][0]) * 1e3:.1f} ms'
                      for name in MODES),
            flush=True)
    off = median(steps['off'][0])
    print('\n== RankConsistencyHook overhead (2 gloo ranks, CPU, tiny '
          'DINO, modes interleaved per iteration) ==')
    for name in ('every', 'default'):
        ratio = paired_ratio(*steps[name], *steps['off'])
        print(f'{name:8s} / off: step time {ratio:.3f} (paired by batch); '
              f'in the hook {median(in_wall[name]) / off * 100:.2f} % of a '
              f'step (wall), {median(in_cpu[name]) / off * 100:.2f} % (CPU)')


if __name__ == '__main__':
    main()
