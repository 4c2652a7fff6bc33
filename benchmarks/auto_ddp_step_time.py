"""Step time of AutoDDP vs hand-configured DDP, measured side by side.

    python benchmarks/auto_ddp_step_time.py [--cycles 4] [--repeats 2]
                                            [--ext-repeats 1]

Two measurements of tiny DINO training on 2 gloo ranks (CPU):

1. AutoDDP's cost on its fast path, interleaved per iteration. One run of
   AutoDDP on a model with nothing unused; after the probe step it is
   ``find_unused_parameters=False`` DDP, the hand-tuned configuration,
   plus AutoDDP's per-step work: the post-accumulate-grad hooks that
   record which parameters a backward used, and the end-of-backward check
   (with its side-channel sum over the ranks). Iteration by iteration the
   run switches between
     auto   that work on (as in training)
     hand   that work off (hooks emptied, no check): hand-tuned DDP
   Interleaving within one run cancels the load drift of a shared machine,
   which swamps differences between separate runs; the rotation gives
   each mode every batch of the dataset's 8-iteration cycle equally often,
   and every other run starts with the other mode.
2. AutoDDP vs ``find_unused_parameters=True`` (the usual advice) on the
   extended head (an unused ``nn.Parameter``). DDP's flag cannot change
   inside a run, so these are separate runs in alternating order (AB BA);
   the ratio of each pair is printed, so the spread is visible.

Prints the step-time ratios (after --warmup), paired by batch (see
``_common.paired_ratio``: a DETR's step time depends mostly on whether its
batch has boxes, so a plain ratio of medians over a mix of batches is not
stable), and the median wall and CPU time of AutoDDP's end-of-backward
check per step.
"""
import argparse
import time

from _common import (REPO_ROOT, StepTimer, make_dataset, median,  # noqa
                     paired_ratio)

MODES = ('auto', 'hand')
# Iterations per cycle of modes and batches (2 modes, 8 batches).
CYCLE = 16
EXT_VARIANTS = {
    'auto_ext': dict(type='AutoDDP'),
    'fup_ext': dict(type='MMDistributedDataParallel',
                    find_unused_parameters=True),
}


def _mode_at(iteration, first):
    """The mode of ``iteration``: alternate every iteration, and swap the
    pairing every 8 iterations so that each mode meets every batch."""
    index = (iteration + iteration // 8) % 2
    return first if index == 0 else MODES[1 - MODES.index(first)]


def _interleaved_run(work_dir, data_root, iters, first):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from tests.helpers import build_runner
    runner = build_runner(work_dir, data_root, iters, {
        'model_wrapper_cfg': dict(type='AutoDDP'),
        'default_hooks.logger.interval': 1000,
        'train_dataloader.sampler.shuffle': False,
    })
    model = runner.model
    params = [p for _, p in model._trainable()]
    ours = [dict(p._post_accumulate_grad_hooks) for p in params]
    modes, checks = [], []
    watch, check = model._watch_backward, model._check_usage

    def switched_watch(loss, callback):
        # The probe step always runs AutoDDP's own code.
        if model._ddp_built and modes[-1] == 'hand':
            return None
        return watch(loss, callback)

    def timed_check():
        start, start_cpu = time.perf_counter(), time.thread_time()
        check()
        checks.append((len(modes) - 1, time.perf_counter() - start,
                       time.thread_time() - start_cpu))

    class SwitchMode(Hook):
        priority = 'HIGHEST'

        def before_train_iter(self, runner, batch_idx, data_batch=None):
            mode = _mode_at(runner.iter, first)
            for param, hooks in zip(params, ours):
                param._post_accumulate_grad_hooks.clear()
                if mode == 'auto' or not model._ddp_built:
                    param._post_accumulate_grad_hooks.update(hooks)
            modes.append(mode)

    model._watch_backward = switched_watch
    model._check_usage = timed_check
    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(SwitchMode())
    runner.register_hook(timer)
    runner.train()
    assert model.autoddp_decision['mode'] == 'static', model.autoddp_decision
    if dist.get_rank() != 0:
        return None
    return modes, timer.times, timer.batches, checks


def _ext_run(work_dir, data_root, iters, wrapper):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from tests.helpers import build_runner
    from tests.test_wrappers import ddp_probe_heads  # noqa: F401
    runner = build_runner(work_dir, data_root, iters, {
        'model.bbox_head.type': 'DINOHeadWithUnusedParam',
        'model_wrapper_cfg': wrapper,
        'default_hooks.logger.interval': 1000,
        'train_dataloader.sampler.shuffle': False,
    })
    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(timer)
    runner.train()
    return (timer.times, timer.batches) if dist.get_rank() == 0 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--cycles',
        type=int,
        default=4,
        help=f'measured iterations per interleaved run = cycles x {CYCLE}')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--ext-iters', type=int, default=25)
    parser.add_argument('--ext-repeats', type=int, default=1,
                        help='pairs of extended-head runs (AB BA ...)')
    parser.add_argument('--warmup', type=int, default=8)
    args = parser.parse_args()

    import tempfile

    from mmddp_ext.testing import run_on_ranks
    data_root = make_dataset()
    env = {'OMP_NUM_THREADS': '1'}

    steps = {name: ([], []) for name in MODES}  # times, batch indices
    checks = []
    iters = args.warmup + args.cycles * CYCLE
    for repeat in range(args.repeats):
        first = MODES[repeat % 2]
        modes, times, batches, run_checks = run_on_ranks(
            _interleaved_run, 2,
            args=(tempfile.mkdtemp(), data_root, iters, first),
            timeout=1800, env=env)[0]
        this = {name: ([], []) for name in MODES}
        for mode, step, batch in list(zip(modes, times,
                                          batches))[args.warmup:]:
            for store in (steps, this):
                store[mode][0].append(step)
                store[mode][1].append(batch)
        checks += [(wall, cpu) for iteration, wall, cpu in run_checks
                   if iteration >= args.warmup]
        print(f'repeat {repeat} (starts with {first}): median step ' +
              ', '.join(f'{name} {median(this[name][0]) * 1e3:.1f} ms'
                        for name in MODES) +
              '; auto / hand in this run, paired by batch '
              f"{paired_ratio(*this['auto'], *this['hand']):.3f}",
              flush=True)

    ext = {name: ([], []) for name in EXT_VARIANTS}
    pair_ratios = []
    for repeat in range(args.ext_repeats):
        names = list(EXT_VARIANTS)[::1 if repeat % 2 == 0 else -1]
        run = {}
        for name in names:
            times, batches = run_on_ranks(
                _ext_run, 2,
                args=(tempfile.mkdtemp(), data_root, args.ext_iters,
                      EXT_VARIANTS[name]),
                timeout=1800, env=env)[0]
            ext[name][0].extend(times[args.warmup:])
            ext[name][1].extend(batches[args.warmup:])
            run[name] = (times[args.warmup:], batches[args.warmup:])
            print(f'ext pair {repeat} {name:8s} median step '
                  f'{median(run[name][0]) * 1e3:7.1f} ms', flush=True)
        pair_ratios.append(paired_ratio(*run['auto_ext'], *run['fup_ext']))

    hand = median(steps['hand'][0])
    wall = median([w for w, _ in checks])
    cpu = median([c for _, c in checks])
    print('\n== AutoDDP step time (2 gloo ranks, CPU, tiny DINO) ==')
    print('AutoDDP / hand-tuned DDP (nothing unused, interleaved per '
          f"iteration, paired by batch): "
          f"{paired_ratio(*steps['auto'], *steps['hand']):.3f}")
    print(f'AutoDDP end-of-backward check: wall {wall * 1e6:.0f} us = '
          f'{wall / hand * 100:.2f} % of a hand-tuned step; CPU '
          f'{cpu * 1e6:.0f} us = {cpu / hand * 100:.3f} %')
    if pair_ratios:
        print('AutoDDP / find_unused_parameters=True (ext head, separate '
              'runs, paired by batch): '
              f"{paired_ratio(*ext['auto_ext'], *ext['fup_ext']):.3f}"
              ' (per pair: ' + ', '.join(f'{r:.3f}' for r in pair_ratios) +
              ')')


if __name__ == '__main__':
    main()
