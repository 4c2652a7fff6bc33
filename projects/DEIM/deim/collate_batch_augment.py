"""What upstream D-FINE / DEIM's ``BatchImageCollateFunction`` does to a
batch (MixUp, then a multi-scale resize), as a batch augment."""
import random
from typing import List, Optional, Sequence, Tuple

import torch.nn as nn
from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData
from torch import Tensor

# The RT-DETR port's multi-scale batch resize (upstream's sizes, nearest).
from .ports import BatchChoiceResize


@MODELS.register_module()
class CollateBatchAugment(nn.Module):
    """Upstream's collate-time batch augmentation, epoch by epoch.

    For each training batch, in upstream's order and with its draws
    (``engine/data/dataloader.py``, ``BatchImageCollateFunction``):

    1. MixUp: ``random.random() < mixup_prob`` (drawn for every batch) and
       ``mixup_epochs[0] <= epoch < mixup_epochs[-1]``: ``beta =
       round(random.uniform(0.45, 0.55), 6)``; image ``i`` becomes ``beta *
       image_i + (1 - beta) * image_(i-1)`` (the batch rolled by one) and
       gets the boxes and labels of both, its own first.
    2. Multi-scale: with ``scales`` and ``epoch < stop_epoch``, the batch
       is resized to ``random.choice(scales)`` (:class:`BatchChoiceResize`,
       nearest, boxes scaled).

    The epoch is set by :class:`SetEpochHook` (upstream:
    ``DataLoader.set_epoch`` -> ``collate_fn.set_epoch``). Upstream runs
    this in the data workers on images in [0, 1]; here it runs in the data
    preprocessor, after normalisation: MixUp is linear with weights that
    sum to 1, so mixing normalised images gives the normalised mix. The
    per-box ``mixup`` weights upstream adds to the targets are not kept:
    no D-FINE / DEIM loss reads them.

    Args:
        mixup_prob (float): Upstream ``mixup_prob``. Defaults to 0.0.
        mixup_epochs (Sequence[int]): Upstream ``mixup_epochs``: MixUp in
            ``[first, last)``. Defaults to (0, 0).
        scales (Sequence[int], optional): Upstream's multi-scale sizes
            (``generate_scales(base_size, base_size_repeat)``); None: one
            size. Defaults to None.
        stop_epoch (int, optional): First epoch without multi-scale
            (upstream ``stop_epoch``); None: never stops. Defaults to None.
    """

    def __init__(self,
                 mixup_prob: float = 0.0,
                 mixup_epochs: Sequence[int] = (0, 0),
                 scales: Optional[Sequence[int]] = None,
                 stop_epoch: Optional[int] = None) -> None:
        super().__init__()
        if not 0 <= mixup_prob <= 1 or len(mixup_epochs) < 1:
            raise ValueError(
                'CollateBatchAugment needs 0 <= mixup_prob <= 1 and '
                'mixup_epochs [first, last) (upstream mixup_epochs), got '
                f'mixup_prob={mixup_prob}, mixup_epochs={mixup_epochs!r}.')
        self.mixup_prob = mixup_prob
        self.mixup_epochs = tuple(mixup_epochs)
        self.resize = BatchChoiceResize(scales) if scales else None
        self.stop_epoch = stop_epoch
        self.epoch = -1

    def set_epoch(self, epoch: int) -> None:
        """The epoch that starts (see the class doc)."""
        self.epoch = epoch

    def forward(
        self, inputs: Tensor, data_samples: List[DetDataSample]
    ) -> Tuple[Tensor, List[DetDataSample]]:
        """MixUp, then the multi-scale resize (see the class doc)."""
        inputs, data_samples = self.mix(inputs, data_samples)
        if self.resize is not None and (self.stop_epoch is None
                                        or self.epoch < self.stop_epoch):
            inputs, data_samples = self.resize(inputs, data_samples)
        return inputs, data_samples

    def mix(
        self, inputs: Tensor, data_samples: List[DetDataSample]
    ) -> Tuple[Tensor, List[DetDataSample]]:
        """Step 1 of the class doc: MixUp when its draw and its epoch window
        say so. The seam for a batch mix of another recipe (DEIMv2's
        Copy-Blend, tried when MixUp does not apply)."""
        if self.mixup_applies():
            return self.apply_mixup(inputs, data_samples)
        return inputs, data_samples

    def apply_mixup(
        self, inputs: Tensor, data_samples: List[DetDataSample]
    ) -> Tuple[Tensor, List[DetDataSample]]:
        """MixUp with a freshly drawn weight (see :func:`mixup`)."""
        return mixup(inputs, data_samples, self.draw_mix_weight())

    def mixup_applies(self) -> bool:
        """Upstream's MixUp test: ``random.random() < mixup_prob``, drawn
        for every batch, then the epoch window."""
        return random.random() < self.mixup_prob and (
            self.mixup_epochs[0] <= self.epoch < self.mixup_epochs[-1])

    @staticmethod
    def draw_mix_weight() -> float:
        """Upstream's mix weight: ``round(random.uniform(0.45, 0.55), 6)``."""
        return round(random.uniform(0.45, 0.55), 6)


def mixup(inputs: Tensor, data_samples: List[DetDataSample],
          beta: float) -> Tuple[Tensor, List[DetDataSample]]:
    """Mix each image with the previous one of the batch (the first with
    the last), weight ``beta`` on its own; its GT becomes its own followed
    by the other image's."""
    mixed = inputs.roll(shifts=1, dims=0).mul(1.0 - beta).add(inputs.mul(beta))
    count = len(data_samples)
    instances = [s.gt_instances for s in data_samples]
    for index, sample in enumerate(data_samples):
        sample.gt_instances = InstanceData.cat(
            [instances[index], instances[(index - 1) % count]])
    return mixed, data_samples
