r"""Step time of AutoDDP against ``MMDistributedDataParallel`` with the right
flag set by hand, in separate runs paired by batch (A B B A), on a GPU.

    python benchmarks/auto_ddp_gpu_step_time.py [--models co_dino_r50
        rtdetr_r50vd] [--batches 8] [--repeats 3] [--pairs 2]

One rank per GPU with NCCL (on a one-GPU machine: a world of one, which
still runs DDP's reducer and AutoDDP's per-step work: its
post-accumulate-grad hooks and its end-of-backward check with the
side-channel sum). DDP's flag cannot change inside a run, so each mode is
its own process, and the runs alternate AutoDDP, hand, hand, AutoDDP, ...
Every run trains the same ``--batches`` synthetic batches (different box
counts, one image without boxes in every third batch), ``--repeats``
times each after one unmeasured pass; AutoDDP's probe step is in that
pass. The ratio per batch is the mean AutoDDP step time over the mean hand
step time; the result is the median over the batches with its range.

Models (port configs, backbone weights random, multi-scale batch
resizing off so every run sees the same shapes):

- ``co_dino_r50``: ``projects/CO-DETR/configs/codino/
  co_dino_5scale_r50_lsj_8xb2_1x_coco.py``, 2 images of 800 x 1216;
- ``rtdetr_r50vd``: ``projects/RT-DETR/configs/rtdetr_r50vd_6x_coco.py``,
  4 images of 640 x 640.

The hand setting is ``find_unused_parameters=False``: both ports build
the same graph on every rank and batch (AutoDDP's decision line, printed,
says 'static').
"""
import argparse
import json
import os.path as osp
import statistics
import subprocess
import sys
import time

from _common import REPO_ROOT, det_batch

MODELS = {
    'co_dino_r50':
    (osp.join('projects', 'CO-DETR', 'configs', 'codino',
              'co_dino_5scale_r50_lsj_8xb2_1x_coco.py'), (2, 800, 1216)),
    'rtdetr_r50vd': (osp.join('projects', 'RT-DETR', 'configs',
                              'rtdetr_r50vd_6x_coco.py'), (4, 640, 640)),
}
WRAPPERS = {
    'auto': dict(type='AutoDDP'),
    'hand':
    dict(type='MMDistributedDataParallel', find_unused_parameters=False),
}


def batches(shape, count, num_classes):
    images, height, width = shape
    result = []
    for index in range(count):
        boxes = [(index * 5 + image * 3) % 13 + 1 for image in range(images)]
        if index % 3 == 2:
            boxes[-1] = 0
        result.append(
            det_batch(images, height, width, boxes, num_classes, seed=index))
    return result


def one_run(model_name: str, mode: str, count: int, repeats: int) -> dict:
    """Train ``count`` batches ``repeats + 1`` times under ``mode``'s
    wrapper in this process; the step times of the last ``repeats``
    passes per batch."""
    import torch
    import torch.distributed as dist
    from mmdet.registry import MODELS as DET_MODELS
    from mmengine.config import Config
    from mmengine.logging import MMLogger
    from mmengine.optim import OptimWrapper
    from mmengine.registry import MODEL_WRAPPERS, init_default_scope
    from mmengine.utils import import_modules_from_strings

    import mmddp_ext  # noqa: F401
    from mmddp_ext.testing import free_port
    logger = MMLogger.get_instance('mmddp_bench', log_level='INFO')
    config, shape = MODELS[model_name]
    cfg = Config.fromfile(osp.join(REPO_ROOT, config))
    import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
    # CPU and gloo only for a dry run of this script.
    cuda = torch.cuda.is_available()
    device = torch.device('cuda', 0) if cuda else torch.device('cpu')
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(
        'nccl' if cuda else 'gloo',
        init_method=f'tcp://127.0.0.1:{free_port()}',
        rank=0,
        world_size=1)
    model_cfg = cfg.model
    model_cfg.backbone.init_cfg = None
    if 'batch_augments' in model_cfg.data_preprocessor:
        model_cfg.data_preprocessor.batch_augments = None
    torch.manual_seed(0)
    model = DET_MODELS.build(model_cfg).to(device)
    wrapper = MODEL_WRAPPERS.build(
        dict(WRAPPERS[mode], module=model, broadcast_buffers=False))
    optim = OptimWrapper(
        torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4))
    num_classes = _num_classes(model_cfg)
    data = batches(shape, count, num_classes)
    times = [[] for _ in data]
    for repeat in range(repeats + 1):
        for index, batch in enumerate(data):
            _sync(cuda)
            start = time.perf_counter()
            wrapper.train_step(batch, optim)
            _sync(cuda)
            if repeat:
                times[index].append(time.perf_counter() - start)
    decision = getattr(wrapper, 'autoddp_decision', None)
    mode_decided = decision and decision['mode']
    logger.info(f'{model_name} {mode}: decision {mode_decided}')
    dist.destroy_process_group()
    return dict(times=times, decision=mode_decided)


def _sync(cuda: bool) -> None:
    if cuda:
        import torch
        torch.cuda.synchronize()


def _num_classes(model_cfg) -> int:
    for key in ('query_head', 'bbox_head', 'decoder'):
        head = model_cfg.get(key)
        if head is not None and 'num_classes' in head:
            return head['num_classes']
    return 80


def run_in_process(model_name, mode, args) -> dict:
    out = subprocess.run([
        sys.executable,
        osp.abspath(__file__), '--one-run', model_name, mode, '--batches',
        str(args.batches), '--repeats',
        str(args.repeats)
    ],
                         cwd=REPO_ROOT,
                         capture_output=True,
                         text=True,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(f'{model_name} {mode} run failed:\n'
                         f'{out.stdout[-3000:]}\n{out.stderr[-5000:]}')
    line = [x for x in out.stdout.splitlines() if x.startswith('RESULT ')][-1]
    return json.loads(line[len('RESULT '):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--models', nargs='+', default=list(MODELS))
    parser.add_argument('--batches', type=int, default=8)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument(
        '--pairs',
        type=int,
        default=2,
        help='pairs of runs per model (A B, then B A, ...)')
    parser.add_argument('--one-run', nargs=2, metavar=('MODEL', 'MODE'))
    args = parser.parse_args()
    if args.one_run:
        result = one_run(*args.one_run, args.batches, args.repeats)
        print('RESULT ' + json.dumps(result), flush=True)
        return
    import torch
    where = (f'{torch.cuda.get_device_name(0)}, NCCL'
             if torch.cuda.is_available() else 'CPU, gloo (dry run)')
    print(f'device: {where}, one rank, torch {torch.__version__}', flush=True)
    for model_name in args.models:
        per_mode = {
            mode: [[] for _ in range(args.batches)]
            for mode in WRAPPERS
        }
        decisions = set()
        for pair in range(args.pairs):
            order = ['auto', 'hand'] if pair % 2 == 0 else ['hand', 'auto']
            for mode in order:
                result = run_in_process(model_name, mode, args)
                for index, steps in enumerate(result['times']):
                    per_mode[mode][index].extend(steps)
                if mode == 'auto':
                    decisions.add(result['decision'])
                print(
                    f'  {model_name} run {mode}: median step '
                    f'{_median_all(result["times"]) * 1e3:.1f} ms',
                    flush=True)
        ratios = [
            statistics.fmean(a) / statistics.fmean(h)
            for a, h in zip(per_mode['auto'], per_mode['hand'])
        ]
        print(
            f'{model_name}: AutoDDP / hand-set MMDistributedDataParallel '
            f'{statistics.median(ratios):.3f} (median over '
            f'{len(ratios)} batches, range {min(ratios):.3f} to '
            f'{max(ratios):.3f}; {args.pairs} pairs of runs); AutoDDP '
            f'decided {sorted(decisions)}',
            flush=True)


def _median_all(times) -> float:
    return statistics.median([t for steps in times for t in steps])


if __name__ == '__main__':
    main()
