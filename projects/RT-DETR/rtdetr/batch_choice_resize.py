"""Multi-scale training as upstream RT-DETR does it: one square size per
batch, drawn from a fixed list, nearest-neighbour resizing."""
import random
from typing import List, Sequence, Tuple, Union

import torch.nn as nn
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from torch import Tensor

# F.interpolate modes that take no align_corners argument
NO_ALIGN_CORNERS = ('nearest', 'nearest-exact', 'area')


@MODELS.register_module()
class BatchChoiceResize(nn.Module):
    """Resize each training batch to a size drawn from ``scales``.

    Upstream draws ``sz = random.choice(scales)`` for every batch and calls
    ``F.interpolate(images, size=sz)`` (nearest, the default mode): in v1
    inside ``RTDETR.forward`` (``multi_scale``, ``np.random.choice``), in
    v2 in ``BatchImageCollateFunction`` (``scales``). Its list repeats 640
    three times, so 640 is drawn with probability 3/13. Each rank draws
    its own size, as upstream's processes do (no collective). Boxes and
    the shape metainfo are scaled with the images; upstream's boxes are
    normalised, so the resize leaves them as they are.

    mmdet's ``BatchSyncRandomResize`` differs: a uniform draw of multiples
    of ``size_divisor`` from a range, bilinear, broadcast from rank 0, and
    applied from the next batch on.

    Used as ``model.data_preprocessor.batch_augments``; runs in training
    only (``DetDataPreprocessor`` skips batch augments otherwise).

    Args:
        scales (Sequence[int | tuple[int, int]]): Sizes to draw from,
            uniformly over the entries (repeat one to weight it): an int is
            a square side, a pair is (height, width), as ``F.interpolate``
            reads ``size``.
        interpolation (str): ``F.interpolate`` mode. Defaults to
            ``'nearest'``, upstream's.
    """

    def __init__(self,
                 scales: Sequence[Union[int, Tuple[int, int]]],
                 interpolation: str = 'nearest') -> None:
        super().__init__()
        if (not isinstance(scales, (list, tuple)) or not scales
                or not all(_is_size(s) for s in scales)):
            raise ValueError(
                'BatchChoiceResize scales must be a non-empty list of '
                'positive ints (square sides, e.g. upstream RT-DETR\'s '
                '[480, 512, ..., 640, 640, 640, ..., 800]) or (height, '
                f'width) pairs, got {scales!r}.')
        self.scales: List[Tuple[int, int]] = [
            (s, s) if isinstance(s, int) else tuple(s) for s in scales
        ]
        self.interpolation = interpolation

    def forward(
        self, inputs: Tensor, data_samples: List[DetDataSample]
    ) -> Tuple[Tensor, List[DetDataSample]]:
        """Resize ``inputs`` (N, C, H, W) to one drawn size, scale boxes."""
        size = random.choice(self.scales)
        height, width = inputs.shape[-2:]
        if (height, width) == size:
            return inputs, data_samples
        kwargs = {} if self.interpolation in NO_ALIGN_CORNERS else dict(
            align_corners=False)
        inputs = F.interpolate(
            inputs, size=size, mode=self.interpolation, **kwargs)
        scale_y, scale_x = size[0] / height, size[1] / width
        for sample in data_samples:
            sample.set_metainfo({
                'img_shape':
                _scaled(sample.img_shape, scale_y, scale_x),
                'pad_shape':
                _scaled(sample.pad_shape, scale_y, scale_x),
                'batch_input_shape':
                size,
            })
            for key in ('gt_instances', 'ignored_instances'):
                if key in sample and 'bboxes' in sample.get(key):
                    bboxes = sample.get(key).bboxes
                    bboxes[..., 0::2] = bboxes[..., 0::2] * scale_x
                    bboxes[..., 1::2] = bboxes[..., 1::2] * scale_y
        return inputs, data_samples


def _is_size(size) -> bool:
    """A positive int, or a (height, width) pair of them."""
    if isinstance(size, (list, tuple)):
        return len(size) == 2 and all(
            isinstance(s, int) and s > 0 for s in size)
    return isinstance(size, int) and size > 0


def _scaled(shape: Tuple[int, int], scale_y: float,
            scale_x: float) -> Tuple[int, int]:
    return int(shape[0] * scale_y), int(shape[1] * scale_x)
