"""Collate time of empty_gt_guard_collate vs pseudo_collate, side by side.

    python benchmarks/empty_gt_guard_collate_time.py [--rounds 300]
        [--batch-sizes 2 8] [--image-size 96]

Loads a generated ~50 %-empty COCO dataset through the synthetic config's
train pipeline (CocoDataset, LoadAnnotations, Resize, RandomFlip,
PackDetInputs), cuts the samples into fixed batches, and times, in
alternating rounds over the same batches:
  pseudo_collate   MMEngine's default collate_fn
  guard keep       empty_gt_guard_collate(policy='keep') (the default)
  guard swap       empty_gt_guard_collate(policy='swap'): also fills the
                   reservoir and deep-copies a sample into each all-empty
                   batch
It prints the median per-batch times, their ratios to pseudo_collate, what
the guard's inspection and policy add on top of its own transposition of
the batch, and that overhead as a share of producing a batch (pipeline +
collate), which is what a DataLoader worker spends.
"""
import argparse
import gc
import os.path as osp
import tempfile
import time

from _common import REPO_ROOT, median  # noqa: F401  (puts repo on path)


def _load_samples(num_images: int, image_size: int):
    from mmdet.registry import DATASETS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    from mmddp_ext.testing import make_synthetic_coco
    register_all_modules()
    root = tempfile.mkdtemp(prefix='mmddp_bench_')
    make_synthetic_coco(
        osp.join(root, 'train'),
        num_images=num_images,
        image_size=image_size,
        empty=0.5)
    cfg = Config.fromfile(
        osp.join(REPO_ROOT, 'configs', '_base_', 'datasets',
                 'synthetic_coco.py'))
    dataset_cfg = cfg.train_dataloader.dataset
    dataset_cfg.data_root = root + '/'
    for transform in dataset_cfg.pipeline:
        if transform['type'] == 'Resize':
            transform['scale'] = (image_size, image_size)
    dataset = DATASETS.build(dataset_cfg)
    start = time.perf_counter()
    samples = [dataset[i] for i in range(len(dataset))]
    pipeline_per_sample = (time.perf_counter() - start) / len(samples)
    return samples, pipeline_per_sample


def _time_per_batch(collate, batches) -> float:
    start = time.perf_counter()
    for batch in batches:
        collate(batch)
    return (time.perf_counter() - start) / len(batches)


def _bench(samples, batch_size: int, rounds: int):
    from functools import partial

    from mmengine.dataset import pseudo_collate

    from mmddp_ext.datasets import empty_gt_guard_collate, num_gt_instances
    # The guard's own one-pass transposition, timed alone to separate what
    # inspecting the GT and applying the policy add.
    from mmddp_ext.datasets.empty_gt_guard_collate import _collate
    usable = len(samples) - len(samples) % batch_size
    batches = [
        samples[i:i + batch_size] for i in range(0, usable, batch_size)
    ]
    all_empty = sum(1 for batch in batches if not any(
        num_gt_instances(item['data_samples']) for item in batch))
    variants = {
        'pseudo_collate': pseudo_collate,
        'transposition': _collate,
        'guard keep': partial(empty_gt_guard_collate, policy='keep'),
        'guard swap': partial(empty_gt_guard_collate, policy='swap'),
    }
    times = {name: [] for name in variants}
    gc.disable()
    try:
        for _ in range(rounds):
            for name, collate in variants.items():
                times[name].append(_time_per_batch(collate, batches))
    finally:
        gc.enable()
    return {name: median(t) for name, t in times.items()}, all_empty, len(
        batches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rounds', type=int, default=300)
    parser.add_argument('--batch-sizes', type=int, nargs='+', default=[2, 8])
    parser.add_argument('--image-size', type=int, default=96)
    parser.add_argument('--num-images', type=int, default=64)
    args = parser.parse_args()

    samples, pipeline_per_sample = _load_samples(args.num_images,
                                                 args.image_size)
    print(f'\n== empty_gt_guard_collate vs pseudo_collate ({len(samples)} '
          f'samples, ~50 % without GT, {args.image_size}-px images, '
          f'median of {args.rounds} rounds) ==')
    for batch_size in args.batch_sizes:
        med, all_empty, num_batches = _bench(samples, batch_size,
                                             args.rounds)
        base = med['pseudo_collate']
        producing = pipeline_per_sample * batch_size + base
        print(f'batch {batch_size} ({all_empty}/{num_batches} batches '
              f'all-empty): pseudo_collate {base * 1e6:.1f} us/batch')
        for name in ('guard keep', 'guard swap'):
            added = med[name] - med['transposition']
            print(f'  {name}: {med[name] * 1e6:6.1f} us/batch, ratio '
                  f'{med[name] / base:.3f}; inspection + policy '
                  f'{added * 1e6:+.1f} us = {added / producing:+.4%} of '
                  f'producing the batch ({producing * 1e3:.2f} ms)')


if __name__ == '__main__':
    main()
