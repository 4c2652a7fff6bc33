"""Step time of AutoDDP vs hand-configured DDP, measured side by side.

    python benchmarks/auto_ddp_step_time.py [--iters 30] [--repeats 2]

Runs tiny DINO training on 2 gloo ranks (CPU) with, in alternation:
  hand      MMDistributedDataParallel(find_unused_parameters=False), the
            hand-tuned fast path (model with nothing unused)
  auto      AutoDDP with no flag on the same model
  auto_ext  AutoDDP on the extended head (an unused nn.Parameter)
  fup_ext   MMDistributedDataParallel(find_unused_parameters=True) on the
            extended head (the usual advice)
and prints the ratios of the steady-state median step times plus AutoDDP's
one-time start-up cost (its first step minus the hand-tuned first step,
in steady-state steps).
"""
import argparse
import time

from _common import REPO_ROOT, StepTimer, make_dataset, median  # noqa

VARIANTS = {
    'hand': ('DINOHead', dict(type='MMDistributedDataParallel',
                              find_unused_parameters=False)),
    'auto': ('DINOHead', dict(type='AutoDDP')),
    'auto_ext': ('DINOHeadWithUnusedParam', dict(type='AutoDDP')),
    'fup_ext': ('DINOHeadWithUnusedParam',
                dict(type='MMDistributedDataParallel',
                     find_unused_parameters=True)),
}


def _time_run(work_dir, data_root, iters, head, wrapper):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from tests.helpers import build_runner
    from tests.test_wrappers import ddp_probe_heads  # noqa: F401
    runner = build_runner(work_dir, data_root, iters, {
        'model.bbox_head.type': head,
        'model_wrapper_cfg': wrapper,
        'default_hooks.logger.interval': 1000,
        'train_dataloader.sampler.shuffle': False,
    })
    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(timer)
    # AutoDDP's own per-step work, its end-of-backward check: wall time
    # (which includes waiting at the side channel for the slower rank, time
    # DDP's own all-reduce would wait otherwise) and this thread's CPU time.
    extra = []
    if hasattr(runner.model, '_check_usage'):
        check = runner.model._check_usage

        def timed_check():
            start, start_cpu = time.perf_counter(), time.thread_time()
            check()
            extra.append((time.perf_counter() - start,
                          time.thread_time() - start_cpu))

        runner.model._check_usage = timed_check
    runner.train()
    return (timer.times, extra) if dist.get_rank() == 0 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=5)
    args = parser.parse_args()

    import tempfile

    from mmddp_ext.testing import run_on_ranks
    data_root = make_dataset()
    steady = {name: [] for name in VARIANTS}
    first = {name: [] for name in VARIANTS}
    extra = {name: [] for name in VARIANTS}
    for repeat in range(args.repeats):
        for name, (head, wrapper) in VARIANTS.items():
            times, checks = run_on_ranks(
                _time_run, 2,
                args=(tempfile.mkdtemp(), data_root, args.iters, head,
                      wrapper),
                timeout=900,
                env={'OMP_NUM_THREADS': '1'})[0]
            steady[name] += times[args.warmup:]
            extra[name] += checks
            first[name].append(times[0])
            print(f'repeat {repeat} {name:9s} median step '
                  f'{median(times[args.warmup:]) * 1e3:7.1f} ms, first step '
                  f'{times[0] * 1e3:7.1f} ms', flush=True)
    med = {name: median(v) for name, v in steady.items()}
    startup = (median(first['auto']) - median(first['hand'])) / med['hand']
    print('\n== AutoDDP step time (2 gloo ranks, CPU, tiny DINO) ==')
    print(f"AutoDDP / hand-tuned DDP (nothing unused):      "
          f"{med['auto'] / med['hand']:.3f}")
    print(f"AutoDDP / find_unused_parameters=True (ext head): "
          f"{med['auto_ext'] / med['fup_ext']:.3f}")
    print(f"AutoDDP (ext head) / hand-tuned DDP:            "
          f"{med['auto_ext'] / med['hand']:.3f}")
    print(f'AutoDDP one-time start-up cost: {startup:+.2f} steps')
    for name in ('auto', 'auto_ext'):
        wall = median([w for w, _ in extra[name]])
        cpu = median([c for _, c in extra[name]])
        print(f'AutoDDP per-step check ({name}): wall {wall * 1e6:.0f} us '
              f"= {wall / med['hand']:.5f} of a hand-tuned step; CPU "
              f"{cpu * 1e6:.0f} us = {cpu / med['hand']:.5f}")


if __name__ == '__main__':
    main()
