"""DEIMv2's collate-time batch augmentation: DEIM's MixUp or, when MixUp
does not apply, Copy-Blend; then DEIM's multi-scale resize."""
import random
from numbers import Real
from typing import List, NamedTuple, Optional, Sequence, Tuple

from mmdet.registry import MODELS
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import BaseBoxes, get_box_tensor
from mmengine.structures import InstanceData
from torch import Tensor

from .ports import CollateBatchAugment

COPY_BLEND_TYPES = ('blend', 'copy')


class PooledObject(NamedTuple):
    """A box Copy-Blend may paste: its image, its row in the batch's pool
    of instances, its pixel box (truncated to ints and clipped to the
    image, as upstream does before pasting)."""
    image: int
    row: int
    x1: int
    y1: int
    x2: int
    y2: int


class Placement(NamedTuple):
    """Where one object goes: the source and target pixel regions (both
    grown by the expansion, if any) and the pasted object's new box (the
    unexpanded one)."""
    source: Tuple[slice, slice]
    target: Tuple[slice, slice]
    box: Tuple[int, int, int, int]


@MODELS.register_module()
class DEIMv2CollateBatchAugment(CollateBatchAugment):
    """Upstream DEIMv2's collate-time batch augmentation, epoch by epoch.

    DEIMv2's ``BatchImageCollateFunction`` (``engine/data/dataloader.py``)
    is DEIM's with Copy-Blend added. For each training batch, in its order
    and with its draws:

    1. A mix weight ``beta = round(random.uniform(0.45, 0.55), 6)``, drawn
       for every batch.
    2. MixUp exactly as :class:`CollateBatchAugment` (its own draw,
       ``random.random() < mixup_prob``, its window, a new weight).
    3. Only when MixUp does not apply (upstream's ``elif``): Copy-Blend if
       ``copyblend_epochs[0] <= epoch < copyblend_epochs[-1]`` and then
       (drawn only inside the window) ``random.random() <
       copyblend_prob``. Its pool is every GT box of the batch whose area
       is at least ``area_threshold``; nothing is pasted when it is empty.
       Each image in turn gets ``min(num_objects, pool size)`` objects
       (``random.randint(1, that)`` with ``random_num_objects``) drawn
       without replacement (``random.sample``) from the pool, its own
       included. An object's box is truncated to integer pixels and
       clipped to the image (skipped when nothing is left), placed at a
       uniformly drawn top-left corner that keeps it inside the image,
       and, with ``with_expand``, both regions grow on each side by
       ``int(side * ratio)`` pixels (``ratio = round(random.uniform(
       *expand_ratios), 6)``), less where either image's border is
       nearer. The region then becomes ``target * beta + source * (1 -
       beta)`` (``'blend'``) or the source's pixels (``'copy'``); the
       source pixels are always those of the batch before any paste, the
       target's include earlier pastes into it. The pasted objects' boxes
       (unexpanded, at their new place) are appended to the image's GT
       after its own, with their labels and other fields.
    4. The multi-scale resize, as :class:`CollateBatchAugment`.

    Differences from upstream, and why:

    - The area compared with ``area_threshold`` is the box's area in
      pixels of the batch image. Upstream compares the COCO annotation's
      ``area`` field (the segmentation's area in the original image, which
      its transforms never rescale); mmdet's data samples do not carry it.
    - It runs in the data preprocessor on normalised images (see
      :class:`CollateBatchAugment`): a blend's weights sum to 1 and a copy
      moves pixels, so both commute with the per-channel normalisation.
    - Places are drawn over the whole batch tensor, padding included;
      upstream's batches have none (one fixed size), and neither do the
      DEIMv2 configs' (a fixed square resize, a multiple of 32).
    - The per-box ``mixup`` weights and ``area`` upstream appends are not
      kept: no DEIMv2 loss reads them. ``conflict_with_mixup`` (stored,
      never read upstream) and ``data_vis`` are not ported.

    Each rank draws from its own Python ``random`` state, as upstream's
    processes do; there is no collective.

    Args:
        copyblend_prob (float): Upstream ``copyblend_prob``: probability
            of Copy-Blend for a batch inside its window when MixUp does
            not apply. Defaults to 0.0.
        copyblend_epochs (Sequence[int]): Upstream ``copyblend_epochs``:
            Copy-Blend in ``[first, last)``. Defaults to (0, 0).
        copyblend_type (str): Upstream ``copyblend_type``: ``'blend'``
            (weighted with the target's pixels) or ``'copy'`` (the source's
            pixels replace them). Defaults to ``'blend'``.
        area_threshold (float): Upstream ``area_threshold``: the least box
            area in pixels (see above) an object needs to enter the pool.
            Defaults to 100.
        num_objects (int): Upstream ``num_objects``: objects pasted into
            each image (at most the pool's size). Defaults to 3.
        with_expand (bool): Upstream ``with_expand``: paste some context
            around each object. Defaults to False.
        expand_ratios (Sequence[float]): Upstream ``expand_ratios``:
            ``(low, high)`` of the uniform draw of the expansion ratio.
            Defaults to (0.1, 0.25).
        random_num_objects (bool): Upstream ``random_num_objects``: draw
            the number of objects per image from ``1 .. num_objects``.
            Defaults to False.
        **kwargs: Keys of :class:`CollateBatchAugment` (``mixup_prob``,
            ``mixup_epochs``, ``scales``, ``stop_epoch``).
    """

    def __init__(self,
                 copyblend_prob: float = 0.0,
                 copyblend_epochs: Sequence[int] = (0, 0),
                 copyblend_type: str = 'blend',
                 area_threshold: float = 100,
                 num_objects: int = 3,
                 with_expand: bool = False,
                 expand_ratios: Sequence[float] = (0.1, 0.25),
                 random_num_objects: bool = False,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        _check_keys(
            copyblend_prob=copyblend_prob,
            copyblend_epochs=copyblend_epochs,
            copyblend_type=copyblend_type,
            area_threshold=area_threshold,
            num_objects=num_objects,
            with_expand=with_expand,
            expand_ratios=expand_ratios,
            random_num_objects=random_num_objects)
        self.copyblend_prob = copyblend_prob
        self.copyblend_epochs = tuple(copyblend_epochs)
        self.copyblend_type = copyblend_type
        self.area_threshold = area_threshold
        self.num_objects = num_objects
        self.with_expand = with_expand
        self.expand_ratios = tuple(expand_ratios)
        self.random_num_objects = random_num_objects

    def mix(
        self, inputs: Tensor, data_samples: List[DetDataSample]
    ) -> Tuple[Tensor, List[DetDataSample]]:
        """Steps 1 to 3 of the class doc.

        Differs from :meth:`CollateBatchAugment.mix`: a mix weight is drawn
        first for every batch (upstream DEIMv2 does, and Copy-Blend uses
        it), and Copy-Blend is tried when MixUp does not apply.
        """
        blend_weight = self.draw_mix_weight()
        if self.mixup_applies():
            return self.apply_mixup(inputs, data_samples)
        if self.copy_blend_applies():
            return self.copy_blend(inputs, data_samples, blend_weight)
        return inputs, data_samples

    def copy_blend_applies(self) -> bool:
        """Upstream's test: the epoch window first, then (inside it only)
        ``random.random() < copyblend_prob``."""
        first, last = self.copyblend_epochs[0], self.copyblend_epochs[-1]
        return (first <= self.epoch < last
                and random.random() < self.copyblend_prob)

    def copy_blend(self, inputs: Tensor, data_samples: List[DetDataSample],
                   beta: float) -> Tuple[Tensor, List[DetDataSample]]:
        """Paste objects of the batch into each image (step 3 of the class
        doc), weight ``beta`` on the target's pixels."""
        height, width = inputs.shape[-2:]
        instances, pool = self._object_pool(data_samples, height, width)
        if not pool:
            return inputs, data_samples
        pasted = inputs.clone()
        for target, sample in enumerate(data_samples):
            count = min(self.num_objects, len(pool))
            if self.random_num_objects:
                count = random.randint(1, count)
            rows, boxes = [], []
            for choice in random.sample(range(len(pool)), count):
                placement = self._place(pool[choice], height, width)
                if placement is None:
                    continue
                source = inputs[pool[choice].image, :, placement.source[0],
                                placement.source[1]]
                region = (target, slice(None)) + placement.target
                if self.copyblend_type == 'blend':
                    kept = pasted[region] * beta
                    pasted[region] = kept + source * (1 - beta)
                else:
                    pasted[region] = source
                rows.append(pool[choice].row)
                boxes.append(placement.box)
            if rows:
                sample.gt_instances = _appended(sample.gt_instances, instances,
                                                rows, boxes)
        return pasted, data_samples

    def _object_pool(self, data_samples: List[DetDataSample], height: int,
                     width: int) -> Tuple[Optional[InstanceData], list]:
        """The batch's instances in one :class:`InstanceData` and, image by
        image, the objects whose box area reaches ``area_threshold``."""
        parts, pool, offset = [], [], 0
        for image, sample in enumerate(data_samples):
            gt = sample.gt_instances
            if len(gt) == 0 or 'bboxes' not in gt:
                continue
            parts.append(gt)
            boxes = get_box_tensor(gt.bboxes).tolist()
            for index, (x1, y1, x2, y2) in enumerate(boxes):
                if (x2 - x1) * (y2 - y1) >= self.area_threshold:
                    pool.append(
                        PooledObject(image, offset + index, max(int(x1), 0),
                                     max(int(y1), 0), min(int(x2), width),
                                     min(int(y2), height)))
            offset += len(gt)
        return (InstanceData.cat(parts) if parts else None), pool

    def _place(self, obj: PooledObject, height: int,
               width: int) -> Optional[Placement]:
        """Draw where ``obj`` goes (and its expansion); None, with no draw,
        when its clipped box is empty."""
        box_w, box_h = obj.x2 - obj.x1, obj.y2 - obj.y1
        if box_w <= 0 or box_h <= 0:
            return None
        x1 = random.randint(0, width - box_w) if box_w < width else 0
        y1 = random.randint(0, height - box_h) if box_h < height else 0
        x2, y2 = x1 + box_w, y1 + box_h
        left = top = right = bottom = 0
        if self.with_expand:
            ratio = round(random.uniform(*self.expand_ratios), 6)
            grow_x, grow_y = int(box_w * ratio), int(box_h * ratio)
            # as far as both images' borders allow, on each side
            left = min(grow_x, obj.x1, x1)
            top = min(grow_y, obj.y1, y1)
            right = min(grow_x, width - obj.x2, width - x2)
            bottom = min(grow_y, height - obj.y2, height - y2)
        rows = slice(obj.y1 - top, obj.y2 + bottom)
        columns = slice(obj.x1 - left, obj.x2 + right)
        target = (slice(y1 - top, y2 + bottom), slice(x1 - left, x2 + right))
        return Placement((rows, columns), target, box=(x1, y1, x2, y2))


def _appended(own: InstanceData, pool: InstanceData, rows: List[int],
              boxes: List[Tuple[int, int, int, int]]) -> InstanceData:
    """``own`` followed by the pool's ``rows`` (labels and every other
    field) with ``boxes`` as their boxes."""
    pasted = pool[rows]
    box_tensor = get_box_tensor(pasted.bboxes).new_tensor(boxes)
    pasted.bboxes = type(pasted.bboxes)(box_tensor) if isinstance(
        pasted.bboxes, BaseBoxes) else box_tensor
    return InstanceData.cat([own, pasted]) if len(own) else pasted


def _is_number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_epoch_window(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) >= 1 and all(
        _is_int(epoch) for epoch in value)


def _is_ratio_range(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        _is_number(r) for r in value) and 0 <= value[0] <= value[1]


# key: (test, accepted values, how to fix)
KEY_RULES = dict(
    copyblend_prob=(lambda v: _is_number(v) and 0 <= v <= 1,
                    'a probability in [0, 1]',
                    'e.g. 0.5 (DEIMv2-S), or 0.0 for no Copy-Blend'),
    copyblend_epochs=(_is_epoch_window, 'a list of int epochs [first, last)',
                      'e.g. [4, 120] (DEIMv2-S)'),
    copyblend_type=(lambda v: v in COPY_BLEND_TYPES,
                    f'one of {COPY_BLEND_TYPES}',
                    "'blend' (upstream's default) or 'copy'"),
    area_threshold=(lambda v: _is_number(v) and v >= 0,
                    'a box area in pixels >= 0', "e.g. 100 (upstream's)"),
    num_objects=(lambda v: _is_int(v) and v >= 1, 'an int >= 1',
                 "e.g. 3 (upstream's)"),
    with_expand=(lambda v: isinstance(v, bool), 'True or False',
                 'True (upstream DEIMv2) or False'),
    expand_ratios=(_is_ratio_range, 'a pair (low, high), 0 <= low <= high',
                   "e.g. [0.1, 0.25] (upstream's)"),
    random_num_objects=(lambda v: isinstance(v, bool), 'True or False',
                        "False (upstream's default) or True"),
)


def _check_keys(**keys) -> None:
    """ValueError naming the first bad Copy-Blend key (see the class doc
    for each)."""
    for key, value in keys.items():
        valid, accepted, fix = KEY_RULES[key]
        if not valid(value):
            raise ValueError(
                f'DEIMv2CollateBatchAugment {key} must be {accepted}, got '
                f'{value!r}; set it to {fix}.')
