"""A short 2-rank fine-tune of a tiny DEIM-family config on a ~50%-empty
synthetic set, the way a user fine-tunes: train on one generated set
(the "pretrained" checkpoint), then ``load_from`` it and train on another
set with its own images (half of them without boxes), through
``tools/dist_train.sh`` with the config's recipe (policy, Mosaic, MixUp,
multi-scale, flat-cosine lr, EMA; DEIMv2 also Copy-Blend and the matcher
change). Prints the loss per epoch of the fine-tune and the COCO bbox mAP
(pycocotools, EMA weights) of the checkpoint it starts from and of every
evaluated epoch.

    python benchmarks/deim_finetune_synthetic.py [--model deim|deimv2] \
        [--epochs 6] [--out DIR]

``deim``: the tiny DEIM-D-FINE-N (``deim_hgnetv2_tiny_synthetic.py``);
``deimv2``: DEIMv2-Atto (``deimv2_hgnetv2_atto_tiny_synthetic.py``, the
real Atto model at 96 px).

A measurement, not a test: nothing is asserted.
"""
import argparse
import glob
import json
import os
import os.path as osp
import re
import subprocess
import sys
import tempfile

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)
from mmddp_ext.testing import free_port, make_synthetic_coco  # noqa: E402

CONFIGS = {
    'deim':
    osp.join(REPO, 'projects', 'DEIM', 'configs',
             'deim_hgnetv2_tiny_synthetic.py'),
    'deimv2':
    osp.join(REPO, 'projects', 'DEIMv2', 'configs',
             'deimv2_hgnetv2_atto_tiny_synthetic.py'),
}
TITLES = {'deim': 'the tiny DEIM-D-FINE-N', 'deimv2': 'DEIMv2-Atto (tiny)'}


def data_options(data: str) -> list:
    return [
        f'train_dataloader.dataset.dataset.data_root={data}/',
        f'val_dataloader.dataset.data_root={data}/',
        f'test_dataloader.dataset.data_root={data}/',
        f'val_evaluator.ann_file={data}/val/annotations.json',
        f'test_evaluator.ann_file={data}/val/annotations.json',
    ]


def recipe_options(model: str, epochs: int) -> list:
    """The tiny policy stretched over ``epochs``: Mosaic/MixUp in the
    first third, zoom-out/IoU crop in the second, plain in the last;
    DEIMv2's Copy-Blend and matcher change in the second third, as its
    tiny config has them in its second epoch."""
    third = max(1, epochs // 3)
    extra = []
    if model == 'deimv2':
        extra = [
            'model.data_preprocessor.batch_augments.0.copyblend_epochs='
            f'[{third},{2 * third}]',
            f'model.train_cfg.assigner.matcher_change_epoch={third}',
        ]
    return extra + [
        f'train_cfg.max_epochs={epochs}',
        'train_cfg.val_interval=2',
        f'train_dataloader.dataset.policy.epoch=[0,{third},{2 * third}]',
        f'model.data_preprocessor.batch_augments.0.mixup_epochs=[0,{third}]',
        f'model.data_preprocessor.batch_augments.0.stop_epoch={2 * third}',
        f'param_scheduler.0.end={epochs}',
        f'param_scheduler.0.flat_epoch={third}',
        'default_hooks.checkpoint.max_keep_ckpts=1',
    ]


def dist_train(config: str, work_dir: str, options: list) -> str:
    env = dict(os.environ, PORT=str(free_port()), PYTHON=sys.executable)
    cmd = [
        'bash',
        osp.join(REPO, 'tools', 'dist_train.sh'), config, '2', '--work-dir',
        work_dir, '--cfg-options', *options
    ]
    out = subprocess.run(
        cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stdout[-4000:] + out.stderr[-4000:])
    return out.stdout


def evaluate(config: str, checkpoint: str, work_dir: str,
             data: str) -> float:
    cmd = [
        sys.executable,
        osp.join(REPO, 'tools', 'test.py'), config, checkpoint, '--work-dir',
        work_dir, '--cfg-options', *data_options(data)
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stdout[-4000:] + out.stderr[-4000:])
    return float(re.findall(r'coco/bbox_mAP: ([\d.]+)', out.stdout)[-1])


def scalars(work_dir: str) -> list:
    path, = glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))
    with open(path) as f:
        return [json.loads(line) for line in f]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--model', choices=sorted(CONFIGS), default='deim')
    parser.add_argument('--epochs', type=int, default=6)
    parser.add_argument('--images', type=int, default=64)
    parser.add_argument('--out', default=None)
    args = parser.parse_args()
    config = CONFIGS[args.model]
    root = args.out or tempfile.mkdtemp(prefix=f'{args.model}_finetune_')
    pretrain_data = osp.join(root, 'pretrain_data')
    finetune_data = osp.join(root, 'finetune_data')
    for data, seed in ((pretrain_data, 0), (finetune_data, 1)):
        make_synthetic_coco(
            osp.join(data, 'train'),
            num_images=args.images,
            empty=0.5,
            seed=seed)
        make_synthetic_coco(
            osp.join(data, 'val'), num_images=16, empty=0.5, seed=seed + 10)
    pretrain = osp.join(root, 'pretrain')
    dist_train(
        config, pretrain,
        data_options(pretrain_data) + recipe_options(args.model, args.epochs))
    start, = glob.glob(osp.join(pretrain, f'epoch_{args.epochs}.pth'))
    start_map = evaluate(config, start, osp.join(root, 'eval_start'),
                         finetune_data)
    finetune = osp.join(root, 'finetune')
    dist_train(
        config, finetune,
        data_options(finetune_data) + recipe_options(args.model, args.epochs) +
        [f'load_from={start}'])
    rows = scalars(finetune)
    print(f'fine-tune of {TITLES[args.model]}, 2 gloo ranks, '
          f'{args.images} train images (about half without boxes), '
          f'{args.epochs} epochs; work dirs under {root}')
    print(f'mAP of the starting checkpoint on the new set: {start_map:.4f}')
    for epoch in range(1, args.epochs + 1):
        losses = [
            r['loss'] for r in rows if r.get('epoch') == epoch and 'loss' in r
        ]
        maps = [
            r['coco/bbox_mAP'] for r in rows
            if r.get('step') == epoch and 'coco/bbox_mAP' in r
        ]
        mean = sum(losses) / len(losses) if losses else float('nan')
        line = f'epoch {epoch}: mean train loss {mean:.3f}'
        if maps:
            line += f', val bbox mAP {maps[-1]:.4f}'
        print(line)
    return 0


if __name__ == '__main__':
    sys.exit(main())
