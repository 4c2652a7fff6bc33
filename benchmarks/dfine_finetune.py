r"""A short 2-rank fine-tune of D-FINE-N (tiny) on a ~50 %-empty synthetic
set: its loss curve and COCO mAP (pycocotools), before and after.

    python benchmarks/dfine_finetune.py [--iters 300] [--images 160]

Generates a synthetic COCO-format set (96-px shapes, about half of the
training images without boxes, shuffled), measures the untrained model's
bbox mAP on the validation split (single process, the same init), then
trains ``projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py`` on 2
gloo ranks through ``tools/dist_train.sh`` with
``find_unused_parameters=False`` and evaluates at the end. Prints the
total loss every ``iters / 10`` iterations (rank 0's log) and both mAPs.
"""
import argparse
import glob
import json
import os.path as osp
import subprocess
import sys
import tempfile

from _common import REPO_ROOT

CONFIG = osp.join(REPO_ROOT, 'projects', 'D-FINE', 'configs',
                  'dfine_hgnetv2_tiny_synthetic.py')


def data_options(root: str) -> list:
    return [
        f'train_dataloader.dataset.data_root={root}/',
        f'val_dataloader.dataset.data_root={root}/',
        f'test_dataloader.dataset.data_root={root}/',
        f'val_evaluator.ann_file={root}/val/annotations.json',
        f'test_evaluator.ann_file={root}/val/annotations.json',
    ]


def untrained_map(root: str) -> float:
    """bbox mAP of the initialised, untrained model (one process)."""
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(CONFIG)
    cfg.merge_from_dict(dict(opt.split('=', 1) for opt in data_options(root)))
    cfg.work_dir = tempfile.mkdtemp(prefix='dfine_untrained_')
    cfg.launcher = 'none'
    runner = RUNNERS.build(cfg)
    runner.model.init_weights()
    return runner.val()['coco/bbox_mAP']


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--iters', type=int, default=300)
    parser.add_argument('--images', type=int, default=160)
    args = parser.parse_args()
    from mmddp_ext.testing import free_port, make_synthetic_coco
    root = tempfile.mkdtemp(prefix='dfine_finetune_')
    make_synthetic_coco(
        osp.join(root, 'train'), num_images=args.images, empty=0.5)
    make_synthetic_coco(osp.join(root, 'val'), num_images=32, seed=1)
    before = untrained_map(root)
    work_dir = osp.join(root, 'work')
    options = data_options(root) + [
        f'train_cfg.max_iters={args.iters}',
        f'train_cfg.val_interval={args.iters}',
        f'param_scheduler.1.end={args.iters}',
        f'default_hooks.checkpoint.interval={args.iters}',
        'model_wrapper_cfg.type=MMDistributedDataParallel',
        'model_wrapper_cfg.find_unused_parameters=False',
    ]
    subprocess.run([
        'bash',
        osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), CONFIG, '2',
        '--work-dir', work_dir, '--cfg-options', *options
    ],
                   cwd=REPO_ROOT,
                   env=dict(__import__('os').environ, PORT=str(free_port())),
                   check=True,
                   stdout=subprocess.DEVNULL)
    scalars = sorted(
        glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')))[-1]
    with open(scalars) as f:
        records = [json.loads(line) for line in f]
    losses = {r['step']: r['loss'] for r in records if 'loss' in r}
    after = [r for r in records if 'coco/bbox_mAP' in r][-1]
    every = max(args.iters // 10, 1)
    curve = ', '.join(f'{step}: {losses[step]:.2f}' for step in sorted(losses)
                      if step == 1 or step % every == 0)
    print(f'loss (rank 0, every {every} iterations): {curve}')
    print(f"bbox mAP untrained {before:.3f}, after {args.iters} iterations "
          f"{after['coco/bbox_mAP']:.3f} (mAP_50 "
          f"{after['coco/bbox_mAP_50']:.3f})")
    return 0


if __name__ == '__main__':
    sys.exit(main())
