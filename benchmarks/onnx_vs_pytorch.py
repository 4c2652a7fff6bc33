r"""ONNX Runtime (CPU) against PyTorch (CPU): per-image latency of the same
deploy model, side by side in one run.

    python benchmarks/onnx_vs_pytorch.py [--models rtdetrv2_r18 dfine_n \
        deim_n deimv2_atto] [--tiny] [--rounds 3] [--images 3] \
        [--threads 1] [--size H W]

For each model: :func:`mmddp_ext.deploy.build_deploy_model` builds the
deploy model of the config (randomly initialised: no checkpoint; the
speed does not depend on the weights' values, and the graph has no
data-dependent shape), with every BatchNorm redrawn as the deploy tests
do (``tests/test_deploy/deploy_cases.spread_norms``: with the
constructors' initialisation DEIMv2-Atto's scores tie, which would blur
the agreement check below); :func:`~mmddp_ext.deploy.export_onnx` writes
it to a temporary file (opset 17, dynamic batch, not simplified: what
``tools/export_onnx.py`` writes by default), and both run batch 1 on
``--images`` random images of the model's input size:

  pytorch  the ``DeployModel`` under ``torch.no_grad()``,
           ``torch.set_num_threads(threads)``;
  ort      an ``onnxruntime.InferenceSession`` on the CPU provider,
           ``intra_op_num_threads=threads``, ``inter_op_num_threads=1``,
           sequential execution, the default graph optimisation level
           (all).

After one warm-up call of each, every round times each image once on both
sides, back to back, the order alternating from image to image and round
to round, so drift on a shared machine hits both alike. Printed per
model: each side's median per-image latency and its range (min-max over
all calls), ORT / PyTorch of the medians, and the median and range of the
per-round ratios (each round's median ORT latency over its median PyTorch
latency); also the export time and, as a check that both ran the same
model, the largest difference of the sorted scores of one image.

Models (``--tiny``: the families' CPU twins of the deploy tests instead):

  rtdetrv2_r18  projects/RT-DETR/configs/rtdetrv2_r18vd_120e_coco.py, 640
  dfine_n       projects/D-FINE/configs/dfine_hgnetv2_n_coco.py, 640
  deim_n        projects/DEIM/configs/deim_hgnetv2_n_coco.py, 640
  deimv2_atto   projects/DEIMv2/configs/deimv2_hgnetv2_atto_coco.py, 320
  deimv2_s      projects/DEIMv2/configs/deimv2_dinov3_s_coco.py, 640
                (not in the default list: about 1 s per image with one
                thread; its --tiny twin is Atto's, no DINOv3 twin exists)
"""
import argparse
import logging
import os
import os.path as osp
import statistics
import tempfile
import time
import warnings
from typing import Dict, List, NamedTuple, Optional, Sequence

import numpy as np
import torch
from _common import REPO_ROOT, median

SIDES = ('pytorch', 'ort')


class Model(NamedTuple):
    config: str
    tiny: str


MODELS: Dict[str, Model] = {
    'rtdetrv2_r18':
    Model('projects/RT-DETR/configs/rtdetrv2_r18vd_120e_coco.py',
          'configs/rtdetr_tiny.py'),
    'dfine_n':
    Model('projects/D-FINE/configs/dfine_hgnetv2_n_coco.py',
          'projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py'),
    'deim_n':
    Model('projects/DEIM/configs/deim_hgnetv2_n_coco.py',
          'projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py'),
    'deimv2_atto':
    Model('projects/DEIMv2/configs/deimv2_hgnetv2_atto_coco.py',
          'projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py'),
    'deimv2_s':
    Model('projects/DEIMv2/configs/deimv2_dinov3_s_coco.py',
          'projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py'),
}
DEFAULT_MODELS = ('rtdetrv2_r18', 'dfine_n', 'deim_n', 'deimv2_atto')
# [w, h] of the original images the boxes are mapped back to
ORIG_SIZE = (640, 480)


def summarize(rounds: Dict[str, List[List[float]]]) -> Dict[str, float]:
    """Figures of one model from per-round, per-image latencies.

    Args:
        rounds: ``{'pytorch': [[s, ...], ...], 'ort': [[s, ...], ...]}``,
            one list of per-image seconds per round.

    Returns:
        dict: ``<side>_median``, ``<side>_min``, ``<side>_max`` (seconds,
        over every call), ``ratio`` (ORT / PyTorch of the medians),
        ``round_ratio`` (median of the per-round ratios of medians),
        ``round_ratio_min``, ``round_ratio_max`` and ``rounds``.
    """
    found = {}
    for side in SIDES:
        every = [t for one_round in rounds[side] for t in one_round]
        found[f'{side}_median'] = median(every)
        found[f'{side}_min'] = min(every)
        found[f'{side}_max'] = max(every)
    per_round = [
        median(ort) / median(pt)
        for pt, ort in zip(rounds['pytorch'], rounds['ort'])
    ]
    found['ratio'] = found['ort_median'] / found['pytorch_median']
    found['round_ratio'] = statistics.median(per_round)
    found['round_ratio_min'] = min(per_round)
    found['round_ratio_max'] = max(per_round)
    found['rounds'] = len(per_round)
    return found


def report(name: str, size: Sequence[int], images: int, figures: dict,
           export_s: float, score_diff: float) -> None:
    """Print one model's line block (``figures`` from :func:`summarize`)."""
    ms = {k: v * 1e3 for k, v in figures.items() if k.startswith(SIDES)}
    print(f'{name} ({size[0]}x{size[1]}, batch 1, {images} images x '
          f'{figures["rounds"]} rounds; export {export_s:.1f} s; max |sorted '
          f'score diff| {score_diff:.1e})')
    for side, label in zip(SIDES, ('PyTorch', 'ORT')):
        print(f'  {label:8s} median {ms[side + "_median"]:8.1f} ms  range '
              f'{ms[side + "_min"]:.1f}-{ms[side + "_max"]:.1f} ms')
    print(
        f'  ORT/PyTorch {figures["ratio"]:.3f} (per-round ratios: median '
        f'{figures["round_ratio"]:.3f}, range '
        f'{figures["round_ratio_min"]:.3f}-'
        f'{figures["round_ratio_max"]:.3f})',
        flush=True)


def ort_session(path: str, threads: int):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return ort.InferenceSession(
        path, options, providers=['CPUExecutionProvider'])


def time_model(name: str, config: str, size: Optional[Sequence[int]],
               rounds: int, images: int, threads: int, tmp_dir: str) -> None:
    from mmddp_ext.deploy import build_deploy_model, export_onnx
    from tests.test_deploy.deploy_cases import spread_norms
    torch.manual_seed(0)
    model, info = build_deploy_model(osp.join(REPO_ROOT, config), size=size)
    # the folded conv + norm caches refold: they watch the tensors' versions
    spread_norms(model.detector, seed=1)
    path = osp.join(tmp_dir, f'{name}.onnx')
    start = time.perf_counter()
    with warnings.catch_warnings():
        # the TorchScript exporter's shape-inference notices
        warnings.simplefilter('ignore')
        export_onnx(model, info, path)
    export_s = time.perf_counter() - start
    session = ort_session(path, threads)
    height, width = info.input_size
    generator = torch.Generator().manual_seed(0)
    batch = torch.rand(images, 3, height, width, generator=generator)
    sizes = torch.tensor([ORIG_SIZE])
    feeds = [
        dict(
            images=batch[i:i + 1].cpu().numpy(),
            orig_target_sizes=sizes.cpu().numpy())
        for i in range(images)
    ]

    def run(side: str, image: int):
        start = time.perf_counter()
        if side == 'pytorch':
            with torch.no_grad():
                out = model(batch[image:image + 1], sizes)
        else:
            out = session.run(['labels', 'boxes', 'scores'], feeds[image])
        return time.perf_counter() - start, out

    _, (_, _, pt_scores) = run('pytorch', 0)  # warm-up, and the check
    _, (_, _, ort_scores) = run('ort', 0)
    score_diff = float(
        np.abs(
            np.sort(pt_scores.cpu().numpy().ravel()) -
            np.sort(ort_scores.ravel())).max())
    times = {side: [] for side in SIDES}
    for one_round in range(rounds):
        for side in SIDES:
            times[side].append([])
        for image in range(images):
            order = SIDES if (one_round + image) % 2 == 0 else SIDES[::-1]
            for side in order:
                times[side][-1].append(run(side, image)[0])
    report(f'{name} ({osp.basename(config)})', info.input_size, images,
           summarize(times), export_s, score_diff)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--models',
        nargs='+',
        choices=sorted(MODELS),
        default=list(DEFAULT_MODELS))
    parser.add_argument(
        '--tiny',
        action='store_true',
        help="the families' tiny CPU twins instead of the real sizes")
    parser.add_argument('--rounds', type=int, default=3)
    parser.add_argument(
        '--images', type=int, default=3, help='images per round')
    parser.add_argument(
        '--threads',
        type=int,
        default=1,
        help='torch threads and ORT intra-op threads')
    parser.add_argument(
        '--size',
        type=int,
        nargs=2,
        metavar=('H', 'W'),
        help="input size (default: each config's test Resize)")
    args = parser.parse_args()
    import onnxruntime
    from mmengine.logging import MMLogger
    torch.set_num_threads(args.threads)
    # the deploy model's build and export log every choice, and that the
    # weights are random, which they are here on purpose
    MMLogger.get_instance('mmengine').setLevel(logging.ERROR)
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
    print(
        f'torch {torch.__version__}, onnxruntime {onnxruntime.__version__}'
        f', {args.threads} thread(s) each, {os.cpu_count()} CPUs, load '
        f'average {load}',
        flush=True)
    with tempfile.TemporaryDirectory(prefix='onnx_vs_pytorch_') as tmp_dir:
        for name in args.models:
            config = MODELS[name].tiny if args.tiny else MODELS[name].config
            time_model(name, config, args.size, args.rounds, args.images,
                       args.threads, tmp_dir)
    load = ', '.join(f'{x:.2f}' for x in os.getloadavg())
    print(f'load average at the end {load}')


if __name__ == '__main__':
    main()
