"""RT-DETR-tiny DDP step time: DDP-safe plain DDP vs upstream's
``find_unused_parameters=True``, measured side by side.

    python benchmarks/rtdetr_ddp_step_time.py [--iters 30] [--repeats 2]

Trains configs/rtdetr_tiny.py on 2 gloo ranks (CPU) on an unshuffled
synthetic dataset where rank 1 only ever sees images without boxes, in
alternation (AB BA ...) with:
  plain  MMDistributedDataParallel(find_unused_parameters=False), which
         the DDP-safe dn group makes possible
  fup    MMDistributedDataParallel(find_unused_parameters=True), upstream
         RT-DETR's setting (include/optimizer.yml), which pays a graph
         traversal every step
and prints the ratio of the steady-state median step times.
"""
import argparse
import importlib
import os.path as osp
import tempfile

from _common import REPO_ROOT, TIMED_RUN_OVERRIDES, StepTimer, median  # noqa

CONFIG = osp.join(REPO_ROOT, 'configs', 'rtdetr_tiny.py')
VARIANTS = {'plain': False, 'fup': True}


def _time_run(work_dir, data_root, iters, find_unused):
    import torch.distributed as dist
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS

    from tests.helpers import data_overrides, tiny_overrides
    importlib.import_module('projects.RT-DETR.rtdetr')
    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict(data_overrides(data_root))
    cfg.merge_from_dict(tiny_overrides(iters))
    cfg.merge_from_dict({
        'model_wrapper_cfg':
        dict(
            type='MMDistributedDataParallel',
            find_unused_parameters=find_unused),
        **TIMED_RUN_OVERRIDES,
        'train_dataloader.sampler.shuffle':
        False,
    })
    cfg.work_dir = work_dir
    cfg.launcher = 'pytorch'
    runner = RUNNERS.build(cfg)
    timer = type('Timer', (StepTimer, Hook), {})()
    runner.register_hook(timer)
    runner.train()
    return timer.times if dist.get_rank() == 0 else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=30)
    parser.add_argument('--repeats', type=int, default=2)
    parser.add_argument('--warmup', type=int, default=5)
    args = parser.parse_args()

    from mmddp_ext.testing import make_synthetic_coco, run_on_ranks
    data_root = tempfile.mkdtemp(prefix='mmddp_bench_')
    make_synthetic_coco(
        osp.join(data_root, 'train'), num_images=4 * args.iters, empty='odd')
    make_synthetic_coco(osp.join(data_root, 'val'), num_images=2, seed=1)
    steady = {name: [] for name in VARIANTS}
    per_repeat = []
    for repeat in range(args.repeats):
        # Alternate the order (AB BA ...): a shared machine drifts between
        # runs, and the first run of a session is the slowest.
        order = list(VARIANTS.items())[::1 if repeat % 2 == 0 else -1]
        this = {}
        for name, find_unused in order:
            times = run_on_ranks(
                _time_run,
                2,
                args=(tempfile.mkdtemp(), data_root, args.iters, find_unused),
                timeout=900,
                env={'OMP_NUM_THREADS': '1'})[0]
            steady[name] += times[args.warmup:]
            this[name] = median(times[args.warmup:])
            print(
                f'repeat {repeat} {name:5s} median step '
                f'{median(times[args.warmup:]) * 1e3:7.1f} ms',
                flush=True)
        per_repeat.append(this['plain'] / this['fup'])
    med = {name: median(v) for name, v in steady.items()}
    print('\n== RT-DETR-tiny DDP step time (2 gloo ranks, CPU, rank 1 '
          'never sees a box) ==')
    print(f"plain DDP / find_unused_parameters=True: "
          f"{med['plain'] / med['fup']:.3f} (per repeat: " +
          ', '.join(f'{r:.3f}' for r in per_repeat) + ')')


if __name__ == '__main__':
    main()
