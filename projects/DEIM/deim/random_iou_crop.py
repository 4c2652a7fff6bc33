"""The IoU crop of upstream D-FINE / DEIM (torchvision's
``RandomIoUCrop`` behind a probability) as an mmcv transform."""
import random
from typing import List, Optional, Sequence

import numpy as np
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmdet.structures.bbox import HorizontalBoxes

# torchvision's default minimum-IoU options; 1.0 (and above) leaves the
# image as it is.
DEFAULT_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)


@TRANSFORMS.register_module()
class RandomIoUCrop(BaseTransform):
    """SSD's random IoU crop with the semantics of torchvision's
    ``transforms.v2.RandomIoUCrop``, applied with probability ``prob``
    (upstream's ``RandomIoUCrop(p=0.8)`` wrapper).

    Per image: draw a minimum IoU from ``sampler_options`` (1.0: no crop);
    then up to ``trials`` times draw a crop whose width and height are
    independent fractions in [``min_scale``, ``max_scale``] of the image's,
    with width / height in [``min_aspect_ratio``, ``max_aspect_ratio``],
    at a uniform position; keep it when the centre of at least one box is
    inside and the best IoU of those boxes with the crop reaches the
    minimum. When no trial succeeds, draw a new minimum. Boxes whose
    centre is outside the crop are dropped, the others are clipped to it.

    mmdet's ``MinIoURandomCrop`` differs: it asks every box (not the best
    one) to reach the minimum, draws both sides from one range without the
    0.0 option, and crops images without boxes, which torchvision (and so
    upstream) never does (no box can have its centre in the crop, so only
    the no-crop option ends the search).

    Args:
        prob (float): Probability of trying a crop (upstream ``p``).
            Defaults to 0.8.
        min_scale (float): Smallest side fraction. Defaults to 0.3.
        max_scale (float): Largest side fraction. Defaults to 1.0.
        min_aspect_ratio (float): Smallest crop width / height. Defaults
            to 0.5.
        max_aspect_ratio (float): Largest crop width / height. Defaults to
            2.0.
        sampler_options (Sequence[float], optional): Minimum IoUs to draw
            from; values >= 1 mean no crop. Defaults to None
            (torchvision's ``(0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)``).
        trials (int): Crops drawn per minimum IoU. Defaults to 40.
    """

    def __init__(self,
                 prob: float = 0.8,
                 min_scale: float = 0.3,
                 max_scale: float = 1.0,
                 min_aspect_ratio: float = 0.5,
                 max_aspect_ratio: float = 2.0,
                 sampler_options: Optional[Sequence[float]] = None,
                 trials: int = 40) -> None:
        if not 0 <= prob <= 1:
            raise ValueError(f'RandomIoUCrop prob must be in [0, 1], got '
                             f'{prob}.')
        options = list(DEFAULT_OPTIONS if sampler_options is
                       None else sampler_options)
        if not any(option >= 1.0 for option in options):
            raise ValueError(
                'RandomIoUCrop sampler_options must contain a value >= 1 '
                '(no crop): an image without boxes can only leave the '
                f'search through it; got {options}.')
        self.prob = prob
        self.min_scale = min_scale
        self.max_scale = max_scale
        self.min_aspect_ratio = min_aspect_ratio
        self.max_aspect_ratio = max_aspect_ratio
        self.options = options
        self.trials = trials

    def _crop(self, boxes: np.ndarray, height: int,
              width: int) -> Optional[List[int]]:
        """(left, top, right, bottom) of the crop, or None for no crop."""
        while True:
            min_iou = random.choice(self.options)
            if min_iou >= 1.0:
                return None
            for _ in range(self.trials):
                span = self.max_scale - self.min_scale
                new_w = int(width * (self.min_scale + span * random.random()))
                new_h = int(height * (self.min_scale + span * random.random()))
                if new_h == 0 or not (self.min_aspect_ratio <= new_w / new_h <=
                                      self.max_aspect_ratio):
                    continue
                left = int((width - new_w) * random.random())
                top = int((height - new_h) * random.random())
                right, bottom = left + new_w, top + new_h
                if left == right or top == bottom:
                    continue
                inside = _centre_inside(boxes, (left, top, right, bottom))
                if not inside.any():
                    continue
                crop = HorizontalBoxes(
                    np.array([[left, top, right, bottom]], np.float32))
                ious = HorizontalBoxes(boxes[inside]).overlaps(
                    HorizontalBoxes(boxes[inside]), crop)
                if float(ious.max()) < min_iou:
                    continue
                return [left, top, right, bottom]

    def transform(self, results: dict) -> dict:
        """Crop ``img`` and the GT fields (see the class doc)."""
        if random.random() >= self.prob:
            return results
        height, width = results['img'].shape[:2]
        boxes = results['gt_bboxes']
        crop = self._crop(boxes.cpu().numpy(), height, width)
        if crop is None:
            return results
        left, top, right, bottom = crop
        keep = _centre_inside(boxes.cpu().numpy(), crop)
        results['img'] = results['img'][top:bottom, left:right]
        results['img_shape'] = results['img'].shape[:2]
        cropped = boxes[keep]
        cropped.translate_([-left, -top])
        cropped.clip_([bottom - top, right - left])
        results['gt_bboxes'] = cropped
        for key in ('gt_bboxes_labels', 'gt_ignore_flags'):
            if key in results:
                results[key] = results[key][keep]
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(prob={self.prob}, '
                f'min_scale={self.min_scale}, max_scale={self.max_scale}, '
                f'options={self.options}, trials={self.trials})')


def _centre_inside(boxes: np.ndarray, crop: Sequence[int]) -> np.ndarray:
    left, top, right, bottom = crop
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    return ((left < centres[:, 0]) & (centres[:, 0] < right) &
            (top < centres[:, 1]) & (centres[:, 1] < bottom))
