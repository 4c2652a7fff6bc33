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
        first, last = train[0], train[-1]
        print(f"iterations: {last.get('iter')}   loss: {first['loss']:.3f} "
              f"(iter {first.get('iter')}) -> {last['loss']:.3f}")
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
