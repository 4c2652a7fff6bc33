"""Generate small COCO-format detection datasets with controlled emptiness.

Objects are filled squares, discs and triangles, one colour per class, on
a noisy background, so a tiny detector can learn them in a few hundred
iterations. Each annotation has its box and the shape's outline as a
polygon ``segmentation`` (for instance-segmentation models; later shapes
may cover earlier ones, which the polygons ignore). Which images have no
boxes is set by ``empty``:

- ``'none'``: every image has 1..``max_boxes`` boxes.
- ``'all'``: no image has a box.
- ``'odd'``: odd-indexed images are empty. With an unshuffled sampler on 2
  ranks, rank 1 then only ever sees empty images.
- ``'modN:R'``: images whose index ``i % N == R`` are empty (``'mod3:1'``
  leaves rank 1 of 3 with only empty images).
- a float in [0, 1]: that fraction of images, chosen at random.
"""
import json
import os
import os.path as osp
from typing import Dict, Sequence, Union

import cv2
import numpy as np

CLASS_SHAPES = ('square', 'disc', 'triangle')
CLASS_COLOURS = ((230, 60, 60), (60, 200, 60), (60, 90, 230), (220, 200, 40),
                 (200, 60, 200), (40, 200, 200))


def empty_mask(num_images: int, empty: Union[str, float],
               rng: np.random.Generator) -> np.ndarray:
    """Boolean array: which image indices get no boxes."""
    index = np.arange(num_images)
    if isinstance(empty, str):
        if empty == 'none':
            return np.zeros(num_images, bool)
        if empty == 'all':
            return np.ones(num_images, bool)
        if empty == 'odd':
            return index % 2 == 1
        if empty.startswith('mod') and ':' in empty:
            period, remainder = (int(v) for v in empty[3:].split(':'))
            return index % period == remainder
    elif isinstance(empty, (float, int)) and 0 <= empty <= 1:
        mask = np.zeros(num_images, bool)
        mask[rng.permutation(num_images)[:round(empty * num_images)]] = True
        return mask
    raise ValueError(
        "empty must be 'none', 'all', 'odd', 'modN:R' or a fraction in "
        f'[0, 1], but got {empty!r}')


def _outline(shape: str, box) -> np.ndarray:
    """The shape's outline as an (N, 2) int32 polygon inside ``box``."""
    x0, y0, w, h = (int(v) for v in box)
    if shape == 'square':
        return np.array([[x0, y0], [x0 + w - 1, y0], [x0 + w - 1, y0 + h - 1],
                         [x0, y0 + h - 1]], np.int32)
    if shape == 'disc':
        return cv2.ellipse2Poly((x0 + w // 2, y0 + h // 2),
                                (w // 2, h // 2), 0, 0, 360, 15)
    return np.array([[x0 + w // 2, y0], [x0, y0 + h - 1],
                     [x0 + w - 1, y0 + h - 1]], np.int32)


def _draw(image: np.ndarray, shape: str, colour, box) -> list:
    """Draw ``shape`` filling ``box``; return its COCO polygon
    (``[[x1, y1, x2, y2, ...]]``)."""
    x0, y0, w, h = (int(v) for v in box)
    outline = _outline(shape, box)
    if shape == 'square':
        cv2.rectangle(image, (x0, y0), (x0 + w - 1, y0 + h - 1), colour, -1)
    elif shape == 'disc':
        cv2.ellipse(image, (x0 + w // 2, y0 + h // 2), (w // 2, h // 2), 0,
                    0, 360, colour, -1)
    else:
        cv2.fillPoly(image, [outline], colour)
    return [[float(v) for v in outline.reshape(-1)]]


def make_synthetic_coco(out_dir: str,
                        num_images: int = 16,
                        classes: Sequence[str] = CLASS_SHAPES[:2],
                        image_size: int = 96,
                        empty: Union[str, float] = 0.5,
                        max_boxes: int = 3,
                        seed: int = 0,
                        ann_name: str = 'annotations.json') -> Dict[str, str]:
    """Write images and a COCO annotation file under ``out_dir``.

    Args:
        out_dir (str): Output directory; images go to ``out_dir/images``.
        num_images (int): Number of images. Defaults to 16.
        classes (Sequence[str]): Category names; the i-th class is drawn as
            ``CLASS_SHAPES[i % 3]`` in ``CLASS_COLOURS[i % 6]``.
            Defaults to ``('square', 'disc')``.
        image_size (int): Square image side in pixels. Defaults to 96.
        empty (str | float): Which images have no boxes (module docstring).
            Defaults to 0.5.
        max_boxes (int): Most boxes per non-empty image. Defaults to 3.
        seed (int): Random seed; the same seed writes the same dataset.
            Defaults to 0.
        ann_name (str): Annotation file name. Defaults to
            'annotations.json'.

    Returns:
        dict: ``data_root``, ``ann_file`` (relative to data_root),
        ``img_prefix`` and the ``classes`` tuple.
    """
    if num_images < 1 or max_boxes < 1 or image_size < 32:
        raise ValueError(
            'num_images and max_boxes must be >= 1 and image_size >= 32, '
            f'but got {num_images}, {max_boxes}, {image_size}')
    rng = np.random.default_rng(seed)
    empties = empty_mask(num_images, empty, rng)
    os.makedirs(osp.join(out_dir, 'images'), exist_ok=True)
    images, annotations = [], []
    for img_id in range(num_images):
        image = rng.integers(90, 140, (image_size, image_size, 3), np.uint8)
        file_name = f'{img_id:05d}.png'
        num_boxes = 0 if empties[img_id] else int(
            rng.integers(1, max_boxes + 1))
        for _ in range(num_boxes):
            label = int(rng.integers(len(classes)))
            side = int(rng.integers(image_size // 6, image_size // 2.5))
            x0, y0 = (int(v) for v in rng.integers(0, image_size - side, 2))
            polygon = _draw(image, CLASS_SHAPES[label % 3],
                            CLASS_COLOURS[label % 6], (x0, y0, side, side))
            annotations.append(
                dict(
                    id=len(annotations) + 1,
                    image_id=img_id,
                    category_id=label + 1,
                    bbox=[x0, y0, side, side],
                    area=float(side * side),
                    segmentation=polygon,
                    iscrowd=0))
        cv2.imwrite(osp.join(out_dir, 'images', file_name), image)
        images.append(
            dict(
                id=img_id,
                file_name=file_name,
                width=image_size,
                height=image_size))
    categories = [
        dict(id=i + 1, name=name, supercategory='shape')
        for i, name in enumerate(classes)
    ]
    with open(osp.join(out_dir, ann_name), 'w') as f:
        json.dump(
            dict(
                images=images,
                annotations=annotations,
                categories=categories), f)
    return dict(
        data_root=out_dir,
        ann_file=ann_name,
        img_prefix='images/',
        classes=tuple(classes))
