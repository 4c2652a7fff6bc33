"""ONNX export of a :class:`DeployModel` with upstream's contract, and
ONNX Runtime runs of the result. ``onnx`` and ``onnxruntime`` (the
``deploy`` extra) are imported only here, when called."""
import os
import os.path as osp
import warnings
from typing import Dict, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmengine.logging import print_log

from .build_deploy_model import DeployInfo
from .deploy_model import DeployModel

INPUT_NAMES = ('images', 'orig_target_sizes')
OUTPUT_NAMES = ('labels', 'boxes', 'scores')
BATCH_AXIS = 'N'
DEFAULT_OPSET = 17
# ONNX's GridSample (the deformable attention's sampling) exists from 16.
MIN_OPSET = 16
# [w, h] of the images onnxruntime_differences makes up, and the score
# difference within which it takes two detections for a tie
ORIG_SIZE = (640, 480)
SCORE_TIE = 1e-5
DEPLOY_EXTRA = 'pip install "mmddp_ext[deploy]" (onnx, onnxruntime)'


def export_onnx(model: DeployModel,
                info: DeployInfo,
                output: str,
                opset: int = DEFAULT_OPSET,
                dynamic_batch: bool = True,
                simplify: bool = False) -> str:
    """Export ``model`` to ``output``: inputs ``images`` (N, 3, H, W)
    float32 and ``orig_target_sizes`` (N, 2) int64, outputs ``labels``
    (N, K) int64, ``boxes`` (N, K, 4) float32 and ``scores`` (N, K)
    float32, N a dynamic axis named ``'N'`` (upstream's names and axis),
    checked with ``onnx.checker`` and with ``info`` in the model's
    ``metadata_props``.

    The exporter is torch's TorchScript-based one (``dynamo=False``),
    chosen deliberately: upstream's four ``export_onnx.py`` use it; with
    torch 2.13 it exports each tiny port in about 2 s, while the default
    ``torch.export``-based exporter needs the ``onnxscript`` package, took
    28 s on tiny RT-DETR and its conversion to opset 17 failed ("No
    Adapter To Version $17 for Pad"), leaving a graph ONNX Runtime
    refused. The trace fixes every shape-derived Python value (level
    sizes, anchors) for H x W, as upstream's ``eval_spatial_size`` does;
    the batch axis stays symbolic, traced with 2 images
    (:func:`onnxruntime_differences` runs another batch size).

    Args:
        model (DeployModel): The model (:func:`build_deploy_model`).
        info (DeployInfo): What it was built from.
        output (str): The ``.onnx`` file written.
        opset (int): ONNX opset, at least 16. Defaults to 17 (upstream
            DEIMv2's default; RT-DETR's and D-FINE's scripts use 16).
        dynamic_batch (bool): A dynamic batch axis ``'N'``; False fixes
            it to 1. Defaults to True.
        simplify (bool): Run ``onnxsim`` (not part of the extra) on the
            graph, as upstream's ``--simplify``. Defaults to False.

    Returns:
        str: ``output``.
    """
    onnx = _require('onnx')
    if opset < MIN_OPSET:
        raise ValueError(
            f'opset={opset}: the deformable attention exports to '
            f'GridSample, which needs opset {MIN_OPSET} or later. Use '
            f'--opset {DEFAULT_OPSET}.')
    height, width = info.input_size
    batch = 2 if dynamic_batch else 1
    device = next(model.parameters()).device
    images = torch.rand(
        batch, 3, height, width,
        generator=torch.Generator().manual_seed(0)).to(device)
    sizes = torch.tensor([[width, height]] * batch, device=device)
    if osp.dirname(output):
        os.makedirs(osp.dirname(output), exist_ok=True)
    _trace(model, (images, sizes), output, opset, dynamic_batch)
    proto = onnx.load(output)
    if simplify:
        proto = _simplified(proto, batch, height, width)
    _declare_k(proto, info.num_top_queries)
    for key, value in info.metadata().items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(proto)
    onnx.save(proto, output)
    print_log(
        f'exported {output} ({osp.getsize(output) / 2**20:.1f} MiB, opset '
        f'{opset}, batch {BATCH_AXIS if dynamic_batch else 1}, '
        f'{info.weights} weights, K = {info.num_top_queries}'
        f'{", simplified" if simplify else ""})',
        logger='current')
    return output


def _trace(model: DeployModel, inputs: Tuple[torch.Tensor, torch.Tensor],
           output: str, opset: int, dynamic_batch: bool) -> None:
    """``torch.onnx.export`` with the TorchScript exporter (see
    :func:`export_onnx`), upstream's names, and the batch axis of every
    input and output dynamic (``'N'``) when ``dynamic_batch``."""
    batch_axis = {name: {0: BATCH_AXIS} for name in INPUT_NAMES + OUTPUT_NAMES}
    with torch.no_grad(), warnings.catch_warnings():
        # One pass first fills the ports' caches (folded conv + BatchNorm
        # weights, anchors, D-FINE's bins), so that the trace takes them
        # as constants: a fold traced from the parameters gives
        # convolutions whose kernels have no static shape, which the
        # exporter refuses (after load_state_dict, or any write to a
        # weight, the caches are stale).
        model(*inputs)
        # Warnings about Python values fixed by the trace (see
        # export_onnx), and torch's deprecation notices of the exporter
        # chosen there and of the TorchScript machinery it runs on.
        warnings.filterwarnings('ignore', category=torch.jit.TracerWarning)
        warnings.filterwarnings(
            'ignore', message='.*legacy TorchScript-based ONNX export')
        warnings.filterwarnings(
            'ignore', category=DeprecationWarning, module=r'torch\.')
        torch.onnx.export(
            model,
            inputs,
            output,
            input_names=list(INPUT_NAMES),
            output_names=list(OUTPUT_NAMES),
            dynamic_axes=batch_axis if dynamic_batch else None,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False)


def default_onnx_path(checkpoint: Optional[str]) -> str:
    """Upstream's default output: the checkpoint's path with ``.onnx``
    (``model.onnx`` without a checkpoint)."""
    if checkpoint is None:
        return 'model.onnx'
    return osp.splitext(checkpoint)[0] + '.onnx'


def run_onnxruntime(
    model: Union[str,
                 object], images: np.ndarray, orig_target_sizes: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(labels, boxes, scores)`` of an exported model in ONNX Runtime.

    Args:
        model (str | onnxruntime.InferenceSession): The ``.onnx`` file
            (run on the CPU provider) or a session.
        images (np.ndarray): (N, 3, H, W), cast to float32.
        orig_target_sizes (np.ndarray): (N, 2) ``[w, h]``, cast to int64.
    """
    if isinstance(model, str):
        ort = _require('onnxruntime')
        model = ort.InferenceSession(model, providers=['CPUExecutionProvider'])
    feeds = {
        'images':
        np.ascontiguousarray(images, dtype=np.float32),
        'orig_target_sizes':
        np.ascontiguousarray(orig_target_sizes, dtype=np.int64)
    }
    return tuple(model.run(list(OUTPUT_NAMES), feeds))


def onnxruntime_differences(model: DeployModel,
                            onnx_file: str,
                            info: DeployInfo,
                            batch: int = 1,
                            orig_size: Sequence[int] = ORIG_SIZE) -> Dict:
    """ONNX Runtime against the PyTorch model on ``batch`` random images
    (seeded). A report, not a test.

    Scores that tie to float32 rounding may come out of the top-k in
    another order (or swap the K-th detection for another), so each
    PyTorch detection is paired with the ONNX Runtime detection of the
    same image and label whose score is within ``SCORE_TIE`` and whose box
    is nearest.

    Args:
        model (DeployModel): The exported model.
        onnx_file (str): Its export.
        info (DeployInfo): What it was built from.
        batch (int): Images; another count than the export's 2 checks
            that the batch axis is symbolic. Defaults to 1.
        orig_size (Sequence[int]): ``[w, h]`` of the original images.
            Defaults to ``ORIG_SIZE``, (640, 480).

    Returns:
        dict: ``in_order`` (the labels are equal position by position),
        ``max_score_diff`` and ``max_box_diff`` (boxes in original
        pixels) over the pairs, and ``unpaired`` (PyTorch detections
        without a partner).
    """
    height, width = info.input_size
    images = torch.rand(
        batch, 3, height, width, generator=torch.Generator().manual_seed(1))
    sizes = torch.tensor([list(orig_size)] * batch)
    device = next(model.parameters()).device
    with torch.no_grad():
        expected = [
            t.cpu().numpy()
            for t in model(images.to(device), sizes.to(device))
        ]
    actual = run_onnxruntime(onnx_file,
                             images.cpu().numpy(),
                             sizes.cpu().numpy())
    found = dict(
        in_order=bool(np.array_equal(actual[0], expected[0])),
        max_score_diff=0.0,
        max_box_diff=0.0,
        unpaired=0)
    for image in range(batch):
        for label, box, score in zip(*(t[image] for t in expected)):
            partners = ((actual[0][image] == label) &
                        (np.abs(actual[2][image] - score) <= SCORE_TIE))
            if not partners.any():
                found['unpaired'] += 1
                continue
            box_diffs = np.abs(actual[1][image][partners] - box).max(-1)
            nearest = box_diffs.argmin()
            found['max_box_diff'] = max(found['max_box_diff'],
                                        float(box_diffs[nearest]))
            found['max_score_diff'] = max(
                found['max_score_diff'],
                float(abs(actual[2][image][partners][nearest] - score)))
    return found


def _declare_k(proto, num_top_queries: int) -> None:
    """Write K into the outputs' second dimension: with a dynamic batch
    the exporter leaves it symbolic (``TopKscores_dim_1``), although the
    top-k's k is a constant of the graph."""
    for value in proto.graph.output:
        dim = value.type.tensor_type.shape.dim[1]
        dim.ClearField('dim_param')
        dim.dim_value = num_top_queries


def _simplified(proto, batch: int, height: int, width: int):
    try:
        import onnxsim
    except ImportError as error:
        raise ImportError(
            'simplify=True (--simplify) runs onnxsim, which is not '
            'installed: pip install onnxsim, or export without it.') from error
    simplified, checked = onnxsim.simplify(
        proto,
        test_input_shapes={
            'images': [batch, 3, height, width],
            'orig_target_sizes': [batch, 2]
        })
    if not checked:
        raise RuntimeError(
            'onnxsim could not validate the simplified graph against the '
            'exported one; export without --simplify.')
    return simplified


def _require(name: str):
    try:
        return __import__(name)
    except ImportError as error:
        raise ImportError(f'ONNX export needs {name}: {DEPLOY_EXTRA}.') \
            from error
