"""Print a short summary of a training run from its work dir.

    python tools/summarize_run.py work_dirs/demo
"""
import glob
import json
import os.path as osp
import sys


def load_scalars(work_dir: str):
    files = sorted(glob.glob(osp.join(work_dir, '*', 'vis_data',
                                      'scalars.json')))
    if not files:
        raise SystemExit(f'summarize_run.py: no */vis_data/scalars.json in '
                         f'{work_dir}; did training run there?')
    with open(files[-1]) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(work_dir: str) -> None:
    records = load_scalars(work_dir)
    train = [r for r in records if 'loss' in r]
    metrics = [r for r in records if 'coco/bbox_mAP' in r]
    print('=' * 60)
    print(f'run: {work_dir}')
    if train:
        window = max(1, min(10, len(train) // 2))
        start = sum(r['loss'] for r in train[:window]) / window
        end = sum(r['loss'] for r in train[-window:]) / window
        print(f"iterations: {train[-1].get('iter')}   loss (mean of first/"
              f'last {window}): {start:.3f} -> {end:.3f}')
    empty = [r for r in train if 'empty_gt/empty_ratio' in r]
    if empty:
        last = empty[-1]
        per_rank = ', '.join(
            f"rank {key.split('/rank')[1].split('_')[0]}: {int(value)}"
            for key, value in sorted(last.items())
            if key.endswith('_all_empty_batches'))
        print(f"empty-GT samples: {last['empty_gt/empty_ratio']:.0%}   "
              f'all-empty batches: {per_rank}')
    if metrics:
        m = metrics[-1]
        print(f"COCO bbox mAP: {m['coco/bbox_mAP']:.3f}   "
              f"mAP@50: {m['coco/bbox_mAP_50']:.3f}   "
              f"mAP@75: {m['coco/bbox_mAP_75']:.3f}")
    else:
        print('COCO bbox mAP: no evaluation recorded')
    ckpts = sorted(glob.glob(osp.join(work_dir, '*.pth')))
    if ckpts:
        print(f'checkpoint: {ckpts[-1]}')
    print('=' * 60)


if __name__ == '__main__':
    if len(sys.argv) != 2:
        raise SystemExit('usage: python tools/summarize_run.py WORK_DIR')
    main(sys.argv[1])
