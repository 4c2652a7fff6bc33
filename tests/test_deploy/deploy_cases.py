"""The tiny model of each real-time DETR family, checkpoints of random
weights (with and without MMEngine's EMA), test images, upstream's
post-processor written from its definition, and the comparison of two
sets of detections that the deploy tests share."""
import contextlib
import logging
import os.path as osp
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
import torch
from mmengine.config import Config
from mmengine.logging import MMLogger
from torch import Tensor, nn

from ..helpers import REPO_ROOT


class Family(NamedTuple):
    """A family's tiny CPU twin: its config file, the square input side
    the tests export at (None: the test pipeline's), and whether its
    checkpoint has EMA weights."""
    config: str
    side: Optional[int]
    ema: bool


# 64 px where the query count allows; D-FINE's HGNetv2 twins select 30
# queries among the tokens of strides 16 and 32, 45 at 96 px. DEIMv2's
# side is its test pipeline's (96), which the export reads.
FAMILIES: Dict[str, Family] = {
    'rtdetr':
    Family('configs/rtdetr_tiny.py', 64, ema=False),
    'dfine':
    Family(
        'projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py',
        96,
        ema=True),
    'deim_hgnetv2':
    Family(
        'projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py', 96, ema=True),
    'deim_rtdetrv2':
    Family(
        'projects/DEIM/configs/deim_rtdetrv2_tiny_synthetic.py',
        64,
        ema=False),
    'deimv2':
    Family(
        'projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py',
        None,
        ema=True),
}
# Original image sizes [w, h] the boxes are mapped back to: neither is the
# model's size, and the two differ in aspect ratio.
ORIG_SIZES = ((640, 480), (375, 500))


def family_config_file(name: str) -> str:
    """The config file of family ``name``."""
    return osp.join(REPO_ROOT, FAMILIES[name].config)


def build_detector(config_file: str) -> nn.Module:
    """The config's detector with seeded random weights whose features are
    of order one (:func:`spread_norms`)."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    cfg = Config.fromfile(config_file)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    torch.manual_seed(0)
    detector = MODELS.build(cfg.model)
    spread_norms(detector, seed=1)
    return detector.eval()


def spread_norms(model: nn.Module, seed: int) -> None:
    """Redraw every BatchNorm's affine weights and running statistics.

    With the constructors' initialisation DEIMv2-Atto's backbone features
    are about 1e-4 and its encoder scores tie to 1e-6, so float32
    reassociation alone reorders the query selection between PyTorch and
    ONNX Runtime; trained weights have no such ties, and neither do
    these."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0, 0.2, generator=generator)
                module.running_mean.normal_(0, 0.1, generator=generator)
                module.running_var.uniform_(0.5, 1.5, generator=generator)


def save_checkpoint(detector: nn.Module, path: str,
                    ema: bool) -> Dict[str, Dict[str, Tensor]]:
    """Save ``detector`` as MMEngine does, with EMA weights (written by
    MMEngine's own ``EMAHook.before_save_checkpoint``) that differ from
    the trained ones when ``ema``.

    Returns:
        dict: ``'trained'`` and ``'ema'`` state dicts (copies; equal
        without ``ema``).
    """
    from mmengine.hooks import EMAHook
    from mmengine.model import ExponentialMovingAverage
    trained = {k: v.clone() for k, v in detector.state_dict().items()}
    checkpoint = dict(meta=dict(epoch=1), state_dict=detector.state_dict())
    if not ema:
        torch.save(checkpoint, path)
        return dict(trained=trained, ema=trained)
    hook = EMAHook()
    hook.ema_model = ExponentialMovingAverage(detector)
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for param in hook.ema_model.module.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    averaged = {
        k: v.clone()
        for k, v in hook.ema_model.module.state_dict().items()
    }
    hook.before_save_checkpoint(None, checkpoint)
    torch.save(checkpoint, path)
    return dict(trained=trained, ema=averaged)


def scene(height: int, width: int, seed: int) -> np.ndarray:
    """A uint8 RGB image (H, W, 3): a square and a disc on a grey
    background with noise."""
    rng = np.random.default_rng(seed)
    image = np.full((height, width, 3), 90, np.float64)
    image += rng.normal(0, 8, image.shape)
    top, left = (int(v) for v in rng.integers(0, height // 2, 2))
    image[top:top + height // 3, left:left + width // 3] = (220, 60, 40)
    ys, xs = np.mgrid[:height, :width]
    cy, cx = (int(v) for v in rng.integers(height // 3, 2 * height // 3, 2))
    image[(ys - cy)**2 + (xs - cx)**2 < (height // 6)**2] = (40, 200, 90)
    return image.clip(0, 255).astype(np.uint8)


def blank(height: int, width: int) -> np.ndarray:
    """An image without objects: all black."""
    return np.zeros((height, width, 3), np.uint8)


def as_images(rgb: List[np.ndarray], mean, std) -> Tensor:
    """The ``images`` input of uint8 RGB images: [0, 1], then the
    normalisation of the config (``DeployInfo.mean`` / ``std``)."""
    batch = torch.from_numpy(np.stack(rgb)).permute(0, 3, 1, 2).float() / 255
    mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (batch - mean) / std


def upstream_postprocessor(logits: Tensor, boxes: Tensor, sizes: Tensor,
                           num_top_queries: int) -> Tuple[Tensor, ...]:
    """Upstream's ``RTDETRPostProcessor.forward`` with
    ``use_focal_loss=True`` in deploy mode, written from its definition:
    boxes from (cx, cy, w, h) to corners times ``[w, h, w, h]``; top-k of
    the flattened sigmoid scores; label = index mod classes, query =
    index div classes."""
    cx, cy, w, h = boxes.unbind(-1)
    corners = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    corners = corners * sizes.repeat(1, 2).unsqueeze(1)
    num_classes = logits.shape[-1]
    scores, index = torch.topk(
        torch.sigmoid(logits).flatten(1), num_top_queries, dim=-1)
    labels = index % num_classes
    picked = torch.gather(corners, 1,
                          (index // num_classes).unsqueeze(-1).repeat(1, 1, 4))
    return labels, picked, scores


# Agreement of two float32 computations of the same detections. ONNX
# Runtime's kernels (and mmdet's uint8 normalisation) sum in other orders
# than PyTorch's: relative differences of about 1e-7 in the normalised
# boxes and scores were measured (docs/deploy.md), so 1e-5 of the score
# range and of the original image side leaves two orders of magnitude
# while a wrong query, class, scaling or K is off by far more (a box by
# pixels, a K by its shape).
SCORE_ATOL = 1e-5
BOX_ATOL_PER_SIDE = 1e-5


def match_detections(actual: Tuple, expected: Tuple,
                     orig_sizes: Tensor) -> Dict[str, float]:
    """Pair every expected detection with an actual one of the same label
    whose score and box agree within the tolerances above, image by
    image. The order may differ among detections whose scores agree
    within ``SCORE_ATOL`` (top-k breaks such ties either way); each
    image's scores must be in decreasing order.

    Args:
        actual (tuple): ``(labels, boxes, scores)``, tensors or arrays,
            (N, K), (N, K, 4), (N, K).
        expected (tuple): The same, to be matched.
        orig_sizes (Tensor): (N, 2) ``[w, h]``; the box tolerance is
            ``BOX_ATOL_PER_SIDE`` times the longer side.

    Returns:
        dict: The largest ``score`` and ``box`` differences of the pairs,
        and ``in_order`` (the labels were equal position by position).

    Raises:
        AssertionError: Shapes or dtypes differ, or a detection has no
            partner.
    """
    actual = [torch.as_tensor(np.asarray(t)) for t in actual]
    expected = [torch.as_tensor(np.asarray(t)) for t in expected]
    for got, want, name in zip(actual, expected,
                               ('labels', 'boxes', 'scores')):
        assert got.shape == want.shape, (
            f'{name}: shape {tuple(got.shape)}, expected {tuple(want.shape)}')
        assert got.dtype == want.dtype, (
            f'{name}: dtype {got.dtype}, expected {want.dtype}')
    worst = dict(
        score=0.0, box=0.0, in_order=bool(torch.equal(actual[0], expected[0])))
    for image in range(len(expected[0])):
        box_atol = BOX_ATOL_PER_SIDE * float(orig_sizes[image].max())
        scores = actual[2][image]
        assert bool((scores[:-1] >= scores[1:]).all()), 'scores not sorted'
        free = list(range(len(scores)))
        for label, box, score in zip(*(t[image] for t in expected)):
            errors = [(float((actual[2][image, j] - score).abs()),
                       float((actual[1][image, j] - box).abs().max()), j)
                      for j in free if actual[0][image, j] == label]
            fits = [
                e for e in errors if e[0] <= SCORE_ATOL and e[1] <= box_atol
            ]
            assert fits, (
                f'image {image}: no detection of label {int(label)}, score '
                f'{float(score):.6f}, box {box.tolist()} within '
                f'{SCORE_ATOL} / {box_atol:.3g} px; nearest of that label: '
                f'{min(errors, default=None)}')
            score_error, box_error, j = min(fits)
            free.remove(j)
            worst['score'] = max(worst['score'], score_error)
            worst['box'] = max(worst['box'], box_error)
    return worst


class LogCapture(logging.Handler):
    """Messages of the current MMEngine logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def captured_log() -> Iterator[LogCapture]:
    capture = LogCapture()
    logger = MMLogger.get_current_instance()
    logger.addHandler(capture)
    try:
        yield capture
    finally:
        logger.removeHandler(capture)
