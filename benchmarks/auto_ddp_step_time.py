"""Step time of AutoDDP vs hand-configured DDP, measured side by side.

    python benchmarks/auto_ddp_step_time.py [--groups 16] [--repeats 2]
                                            [--ext-repeats 1]

Two measurements of tiny DINO training on 2 gloo ranks (CPU):

1. AutoDDP's cost on its fast path, on the same batches. One run of
   AutoDDP on a model with nothing unused; after the probe step it is
   ``find_unused_parameters=False`` DDP, the hand-tuned configuration,
   plus AutoDDP's per-step work: the post-accumulate-grad hooks that
   record which parameters a backward used, and the end-of-backward check
   (with its side-channel sum over the ranks). Each batch is trained on 4
   times in a row, in the order auto hand hand auto or hand auto auto hand
   (``_common.same_batch_mode``), where
     auto   that work on (as in training)
     hand   that work off (hooks emptied, no check): hand-tuned DDP
   so every comparison is between steps on the same images a few seconds
   apart. That cancels the load drift of a shared machine and the step
   time's dependence on the batch (its boxes set the denoising queries).
2. AutoDDP vs ``find_unused_parameters=True`` (the usual advice) on the
   extended head (an unused ``nn.Parameter``). DDP's flag cannot change
   inside a run, so these are separate runs in alternating order (AB BA),
   paired by batch index (``_common.paired_ratio``); the ratio of each
   pair is printed, so the spread is visible.

Prints the AutoDDP / hand-tuned step-time ratio (median over the
groups of 4 steps, after --warmup-groups, with a 90 % bootstrap interval),
the median wall and CPU time of AutoDDP's end-of-backward check per step,
and the extended-head ratio.
"""
import argparse
import time

from _common import (REPO_ROOT, TIMED_RUN_OVERRIDES, StepTimer,  # noqa
                     make_dataset, median, mode_medians, paired_ratio,
                     register_same_batch_sampler, same_batch_mode,
                     same_batch_overrides, same_batch_ratios)

MODES = ('auto', 'hand')
GROUP = 2 * len(MODES)  # steps per batch
EXT_VARIANTS = {
    'auto_ext': dict(type='AutoDDP'),
    'fup_ext': dict(type='MMDistributedDataParallel',
                    find_unused_parameters=True),
}


def _interleaved_run(work_dir, data_root, iters):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from mmddp_ext.utils.torch_private import post_accumulate_grad_hooks
    from tests.helpers import build_runner
    register_same_batch_sampler()
    runner = build_runner(work_dir, data_root, iters, {
        'model_wrapper_cfg': dict(type='AutoDDP'),
        **TIMED_RUN_OVERRIDES,
        **same_batch_overrides(MODES),
    })
    model = runner.model
    params = [p for _, p in model._trainable()]
    ours = [dict(post_accumulate_grad_hooks(p)) for p in params]
    modes, checks = [], []
    watch, check = model._watch_backward, model._check_usage

    def switched_watch(loss, callback):
        # The probe step always runs AutoDDP's own code.
        if model.ddp_built and modes[-1] == 'hand':
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
            mode = same_batch_mode(runner.iter, MODES)
            for param, hooks in zip(params, ours):
                post_accumulate_grad_hooks(param).clear()
                if mode == 'auto' or not model.ddp_built:
                    post_accumulate_grad_hooks(param).update(hooks)
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
    return modes, timer.times, checks


def _ext_run(work_dir, data_root, iters, wrapper):
    import torch.distributed as dist
    from mmengine.hooks import Hook

    from tests.helpers import build_runner
    from tests.test_wrappers import ddp_probe_heads  # noqa: F401
    runner = build_runner(work_dir, data_root, iters, {
        'model.bbox_head.type': 'DINOHeadWithUnusedParam',
        'model_wrapper_cfg': wrapper,
        **TIMED_RUN_OVERRIDES,
        'train_dataloader.sampler.shuffle': False,
    })
    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(timer)
    runner.train()
    return (timer.times, timer.batches) if dist.get_rank() == 0 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--groups',
        type=int,
        default=16,
        help=f'measured batches per run, each trained on {GROUP} times')
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--warmup-groups', type=int, default=2)
    parser.add_argument('--ext-iters', type=int, default=25)
    parser.add_argument('--ext-repeats', type=int, default=1,
                        help='pairs of extended-head runs (AB BA ...)')
    parser.add_argument('--warmup', type=int, default=8,
                        help='unmeasured iterations of each ext-head run')
    args = parser.parse_args()

    import tempfile

    from mmddp_ext.testing import run_on_ranks
    data_root = make_dataset()
    env = {'OMP_NUM_THREADS': '1'}

    records, checks = [], []  # ((run, group), mode, seconds); (wall, cpu)
    iters = (args.warmup_groups + args.groups) * GROUP
    for repeat in range(args.repeats):
        modes, times, run_checks = run_on_ranks(
            _interleaved_run, 2,
            args=(tempfile.mkdtemp(), data_root, iters),
            timeout=1800, env=env)[0]
        skip = args.warmup_groups * GROUP
        this = [(i // GROUP, mode, step)
                for i, (mode, step) in enumerate(zip(modes, times))
                if i >= skip]
        records += [((repeat, g), m, t) for g, m, t in this]
        checks += [(wall, cpu) for iteration, wall, cpu in run_checks
                   if iteration >= skip]
        ratio, low, high, groups = same_batch_ratios(this, 'auto', 'hand')
        medians = mode_medians(this, MODES)
        print(f'repeat {repeat}: median step ' +
              ', '.join(f'{name} {medians[name] * 1e3:.1f} ms'
                        for name in MODES) +
              f'; auto / hand {ratio:.3f} [{low:.3f}, {high:.3f}] over '
              f'{groups} batches', flush=True)

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

    hand = mode_medians(records, MODES)['hand']
    wall = median([w for w, _ in checks])
    cpu = median([c for _, c in checks])
    ratio, low, high, groups = same_batch_ratios(records, 'auto', 'hand')
    print('\n== AutoDDP step time (2 gloo ranks, CPU, tiny DINO) ==')
    print('AutoDDP / hand-tuned DDP (nothing unused, same batches '
          f'interleaved): {ratio:.3f}, 90 % interval [{low:.3f}, '
          f'{high:.3f}] over {groups} batches')
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
