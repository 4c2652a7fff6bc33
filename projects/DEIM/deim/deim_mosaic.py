"""DEIM's Mosaic (``engine/data/transforms/mosaic.py``) as an mmcv
transform for ``MultiImageMixDataset`` / :class:`EpochPolicyDataset`."""
import math
import random
from typing import List, Sequence, Tuple

import cv2
import mmcv
import numpy as np
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmdet.structures.bbox import HorizontalBoxes


def resize_short_side(img: np.ndarray, size: int) -> Tuple[int, int]:
    """(height, width) with the shorter side ``size`` and the longer one
    scaled and truncated, as torchvision's ``Resize(size)`` for an int."""
    height, width = img.shape[:2]
    short, long = (width, height) if width <= height else (height, width)
    new_long = int(size * long / short)
    return (new_long, size) if width <= height else (size, new_long)


def affine_matrix(center: Sequence[float], angle: float,
                  translate: Sequence[float], scale: float) -> np.ndarray:
    """Forward 2x3 matrix of torchvision's affine (no shear): rotate by
    ``angle`` degrees and scale about ``center``, then translate; the
    matrix of ``_get_inverse_affine_matrix(..., inverted=False)``."""
    rot = math.radians(angle)
    cx, cy = center
    linear = scale * np.array([[math.cos(rot), -math.sin(rot)],
                               [math.sin(rot), math.cos(rot)]])
    offset = np.array([cx + translate[0], cy + translate[1]
                       ]) - linear @ [cx, cy]
    return np.concatenate([linear, offset[:, None]], axis=1)


def warp_affine(img: np.ndarray, matrix: np.ndarray, fill: int) -> np.ndarray:
    """Nearest-neighbour warp with PIL's convention, which torchvision uses
    for PIL images: output pixel (x, y) takes input pixel
    ``floor(inverse @ (x + 0.5, y + 0.5))``, outside pixels are ``fill``.
    cv2 rounds ``inverse' @ (x, y)``, so the inverse is shifted by half a
    pixel on both sides."""
    linear, offset = matrix[:, :2], matrix[:, 2]
    inverse = np.linalg.inv(linear)
    inverse_offset = -inverse @ offset
    shifted = inverse_offset + inverse @ [0.5, 0.5] - 0.5
    inverse_matrix = np.concatenate([inverse, shifted[:, None]], axis=1)
    height, width = img.shape[:2]
    return cv2.warpAffine(
        img,
        inverse_matrix, (width, height),
        flags=cv2.INTER_NEAREST | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_CONSTANT,
        borderValue=(fill, ) * (img.shape[2] if img.ndim == 3 else 1))


def affine_boxes(boxes: np.ndarray, matrix: np.ndarray, height: int,
                 width: int) -> np.ndarray:
    """Boxes enclosing the transformed corners, clipped to the image, as
    torchvision's ``affine`` for ``BoundingBoxes``."""
    corners = boxes[:, [[0, 1], [2, 1], [2, 3], [0, 3]]].reshape(-1, 2)
    moved = corners @ matrix[:, :2].T + matrix[:, 2]
    moved = moved.reshape(-1, 4, 2)
    out = np.concatenate([moved.min(1), moved.max(1)], axis=1)
    out[:, 0::2] = out[:, 0::2].clip(0, width)
    out[:, 1::2] = out[:, 1::2].clip(0, height)
    return out.astype(np.float32)


@TRANSFORMS.register_module()
class DEIMMosaic(BaseTransform):
    """Four images in a 2 x 2 grid, then a random affine: DEIM's
    ``Mosaic`` (with ``use_cache=False``, the DEIM configs' setting).

    Each image (this one, then three drawn uniformly with replacement from
    the dataset: ``get_indexes``) is resized so that its shorter side is
    ``output_size`` (torchvision ``Resize(output_size)``), and pasted at the
    top-left corner of its cell of a ``2 * max_h`` by ``2 * max_w`` canvas
    filled with 0 (``max_h``, ``max_w``: the largest resized height and
    width); boxes move with their image. The canvas then goes through
    torchvision's ``RandomAffine(degrees=rotation_range,
    translate=translation_range, scale=scaling_range, fill=fill_value)``:
    rotation and scale about the canvas centre, a translation of up to the
    given fraction of each side rounded to whole pixels, nearest
    neighbour; each box becomes the box around its four moved corners,
    clipped to the canvas. Boxes that end up smaller than a pixel are left
    to a later ``FilterAnnotations`` (upstream: ``SanitizeBoundingBoxes``).

    Differs from upstream in pixel values only: images are resized with
    cv2's bilinear filter (upstream: PIL's, antialiased); the geometry, the
    draws and the boxes are upstream's. mmdet's ``Mosaic`` differs in
    geometry (a random centre and a crop to ``img_scale``).

    Use inside ``MultiImageMixDataset`` (or :class:`EpochPolicyDataset`),
    which loads the three extra images as ``results['mix_results']``.

    Args:
        output_size (int): Shorter side of each resized image. Defaults to
            320.
        rotation_range (float): Rotation drawn from [-r, r] degrees.
            Defaults to 10.
        translation_range (Sequence[float]): Largest translation as a
            fraction of the canvas width and height. Defaults to
            (0.1, 0.1).
        scaling_range (Sequence[float]): Scale drawn from this range.
            Defaults to (0.5, 1.5).
        fill_value (int): Canvas and affine fill. Defaults to 0.
        prob (float): Probability of the mosaic (upstream
            ``probability``). Defaults to 1.0.
    """

    def __init__(self,
                 output_size: int = 320,
                 rotation_range: float = 10,
                 translation_range: Sequence[float] = (0.1, 0.1),
                 scaling_range: Sequence[float] = (0.5, 1.5),
                 fill_value: int = 0,
                 prob: float = 1.0) -> None:
        if not isinstance(output_size, int) or output_size <= 0:
            raise ValueError('DEIMMosaic output_size must be a positive int '
                             f'(upstream 320), got {output_size!r}.')
        if len(translation_range) != 2 or len(scaling_range) != 2:
            raise ValueError(
                'DEIMMosaic translation_range and scaling_range are pairs, '
                f'got {translation_range!r} and {scaling_range!r}.')
        self.output_size = output_size
        self.rotation_range = rotation_range
        self.translation_range = tuple(translation_range)
        self.scaling_range = tuple(scaling_range)
        self.fill_value = fill_value
        self.prob = prob

    def get_indexes(self, dataset) -> List[int]:
        """Three dataset indices, uniform with replacement (upstream
        ``random.choices(range(len(dataset)), k=3)``)."""
        return random.choices(range(len(dataset)), k=3)

    def _draw_affine(self, height: int, width: int) -> np.ndarray:
        angle = random.uniform(-self.rotation_range, self.rotation_range)
        max_dx = self.translation_range[0] * width
        max_dy = self.translation_range[1] * height
        translate = (int(round(random.uniform(-max_dx, max_dx))),
                     int(round(random.uniform(-max_dy, max_dy))))
        scale = random.uniform(*self.scaling_range)
        return affine_matrix((width * 0.5, height * 0.5), angle, translate,
                             scale)

    def assemble(self, parts: Sequence[dict]) -> Tuple[np.ndarray, np.ndarray]:
        """The 2 x 2 canvas of the four resized images and their boxes
        (xyxy, canvas pixels), before the affine."""
        images, boxes = [], []
        for part in parts:
            new_h, new_w = resize_short_side(part['img'], self.output_size)
            height, width = part['img'].shape[:2]
            images.append(
                mmcv.imresize(
                    part['img'], (new_w, new_h), interpolation='bilinear'))
            scaled = part['gt_bboxes'].cpu().numpy().reshape(-1, 4).copy()
            scaled[:, 0::2] *= new_w / width
            scaled[:, 1::2] *= new_h / height
            boxes.append(scaled)
        max_h = max(img.shape[0] for img in images)
        max_w = max(img.shape[1] for img in images)
        canvas = np.full((2 * max_h, 2 * max_w) + images[0].shape[2:],
                         self.fill_value, images[0].dtype)
        for index, (img, part_boxes) in enumerate(zip(images, boxes)):
            x, y = (index % 2) * max_w, (index // 2) * max_h
            canvas[y:y + img.shape[0], x:x + img.shape[1]] = img
            part_boxes[:, 0::2] += x
            part_boxes[:, 1::2] += y
        return canvas, np.concatenate(boxes)

    def transform(self, results: dict) -> dict:
        """Build the mosaic of ``results`` and ``results['mix_results']``."""
        if 'mix_results' not in results or len(results['mix_results']) != 3:
            raise ValueError(
                'DEIMMosaic needs the three images that '
                'MultiImageMixDataset (or EpochPolicyDataset) loads through '
                'get_indexes; put it in that wrapper\'s pipeline, not in '
                'the dataset\'s.')
        if self.prob < 1.0 and random.random() > self.prob:
            return results
        parts = [results] + list(results['mix_results'])
        canvas, boxes = self.assemble(parts)
        height, width = canvas.shape[:2]
        matrix = self._draw_affine(height, width)
        results['img'] = warp_affine(canvas, matrix, self.fill_value)
        results['img_shape'] = results['img'].shape[:2]
        results['gt_bboxes'] = HorizontalBoxes(
            affine_boxes(boxes, matrix, height, width))
        for key in ('gt_bboxes_labels', 'gt_ignore_flags'):
            if key in results:
                results[key] = np.concatenate([part[key] for part in parts])
        return results

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(output_size={self.output_size}, '
                f'rotation_range={self.rotation_range}, '
                f'translation_range={self.translation_range}, '
                f'scaling_range={self.scaling_range}, '
                f'fill_value={self.fill_value}, prob={self.prob})')
