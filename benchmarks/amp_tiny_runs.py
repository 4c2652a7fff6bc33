r"""Mixed precision on the tiny CO-DINO and RT-DETR configs with one
GT-less rank: fp16 and bf16 runs, side by side (a CUDA machine).

    python benchmarks/amp_tiny_runs.py [--iters 200] [--parallel 4]

Each run is ``tools/dist_train.sh CONFIG 2`` with
``optim_wrapper.type='AmpOptimWrapper'`` and ``optim_wrapper.dtype``
float16 or bfloat16, on a generated dataset whose odd images have no
boxes, read in order (an unshuffled sampler), so rank 1 trains on images
without GT only. Printed per run: whether it exited 0, the mean loss of
the first and of the last 20 logged iterations, how many optimizer steps
the package skipped for a non-finite loss (its log line 'non-finite loss
in iteration'), and the loss scale AMP's scaler ended with (fp16 starts
at 65536 and halves on every step it skips). The runs go in parallel
(``--parallel``): on one GPU the two ranks of each share it with gloo.
"""
import argparse
import glob
import json
import os
import os.path as osp
import re
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from _common import REPO_ROOT

CONFIGS = ('configs/co_dino_tiny.py', 'configs/rtdetr_tiny.py')
DTYPES = ('float16', 'bfloat16')
NON_FINITE_SKIP = re.compile(r'non-finite loss in iteration')
WINDOW = 20


def make_data(root: str) -> None:
    subprocess.run([
        sys.executable,
        osp.join(REPO_ROOT, 'tools', 'make_synthetic_coco.py'), root,
        '--train', '32', '--val', '8', '--empty', 'odd'
    ],
                   check=True,
                   capture_output=True)


def launch(config: str, dtype: str, data_root: str, iters: int,
           port: int) -> dict:
    work_dir = tempfile.mkdtemp(prefix='amp_')
    options = [
        f'data_root={data_root}/',
        f'train_dataloader.dataset.data_root={data_root}/',
        f'val_dataloader.dataset.data_root={data_root}/',
        f'test_dataloader.dataset.data_root={data_root}/',
        f'val_evaluator.ann_file={data_root}/val/annotations.json',
        f'test_evaluator.ann_file={data_root}/val/annotations.json',
        'train_dataloader.sampler.shuffle=False',
        'optim_wrapper.type=AmpOptimWrapper',
        f'optim_wrapper.dtype={dtype}',
        'optim_wrapper.loss_scale=dynamic',
        f'train_cfg.max_iters={iters}',
        f'train_cfg.val_interval={iters}',
    ]
    env = dict(os.environ, PORT=str(port), PYTHON=sys.executable)
    out = subprocess.run([
        'bash',
        osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config, '2',
        '--work-dir', work_dir, '--cfg-options', *options
    ],
                         cwd=REPO_ROOT,
                         env=env,
                         capture_output=True,
                         text=True,
                         timeout=3000)
    text = out.stdout + out.stderr
    losses = []
    for path in glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json')):
        with open(path) as f:
            for line in f:
                record = json.loads(line)
                if 'loss' in record and 'step' in record:
                    losses.append(record['loss'])
    return dict(
        config=config,
        dtype=dtype,
        returncode=out.returncode,
        losses=losses,
        skips=len(NON_FINITE_SKIP.findall(text)),
        loss_scale=_final_loss_scale(work_dir),
        tail='' if out.returncode == 0 else text[-4000:])


def _final_loss_scale(work_dir: str):
    import torch
    paths = sorted(glob.glob(osp.join(work_dir, 'iter_*.pth')))
    if not paths:
        return None
    state = torch.load(paths[-1], map_location='cpu', weights_only=True)
    scaler = state.get('optimizer', {}).get('loss_scaler', {})
    scale = scaler.get('scale')
    return None if scale is None else float(scale)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--iters', type=int, default=200)
    parser.add_argument('--parallel', type=int, default=4)
    args = parser.parse_args()
    from mmddp_ext.testing import free_port
    data_root = tempfile.mkdtemp(prefix='amp_data_')
    make_data(data_root)
    runs = [(c, d) for c in CONFIGS for d in DTYPES]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(
            pool.map(
                lambda run: launch(*run, data_root, args.iters, free_port()),
                runs))
    ok = True
    for result in results:
        losses = result['losses']
        first = statistics.fmean(losses[:WINDOW]) if losses else float('nan')
        last = statistics.fmean(losses[-WINDOW:]) if losses else float('nan')
        falls = bool(losses) and last < first
        ok &= result['returncode'] == 0 and result['skips'] == 0 and falls
        print(f"{result['config']:26s} {result['dtype']:9s} exit "
              f"{result['returncode']}  iterations logged {len(losses)}  "
              f'loss first {WINDOW} {first:.3f} -> last {WINDOW} {last:.3f} '
              f"({'falls' if falls else 'DOES NOT FALL'})  non-finite skips "
              f"{result['skips']}  final loss scale {result['loss_scale']}")
        if result['tail']:
            print(result['tail'])
    print('all runs: exit 0, no non-finite skip, loss falls'
          if ok else 'NOT all runs passed')


if __name__ == '__main__':
    main()
