"""DEIM's data transforms: the Mosaic against upstream's own output,
the IoU crop's semantics (torchvision's), the collate-time MixUp against
upstream's own collate function.

Expected values: ``mosaic_example`` and ``mixup_example`` of
``data/upstream_recipes.json`` (upstream DEIM's ``Mosaic`` and
``BatchImageCollateFunction`` run on the inputs recorded there).
"""
import random

import numpy as np
import pytest
import torch
from mmdet.registry import MODELS, TRANSFORMS
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.structures import InstanceData

from . import upstream_recipes as upstream
from .deim_utils import import_deim


def _mosaic_parts(example):
    """The four images upstream's Mosaic combined, in its order (the
    first, then the dataset indices it drew)."""
    inputs = example['inputs']
    order = [0] + example['indices']
    parts = []
    for index in order:
        boxes = np.array(inputs['boxes'][index], np.float32).reshape(-1, 4)
        parts.append(
            dict(
                img=np.array(example['images'][index], np.uint8),
                gt_bboxes=HorizontalBoxes(boxes),
                gt_bboxes_labels=np.arange(len(boxes)),
            ))
    return parts


def test_mosaic_geometry_equals_upstream():
    """Same four images and the same drawn affine parameters as upstream's
    run: the same canvas, warped image and boxes."""
    deim = import_deim()
    mosaic_module = deim.deim_mosaic
    example = upstream.repository(upstream.DEIM)['mosaic_example']
    inputs = example['inputs']
    mosaic = TRANSFORMS.build(
        dict(
            type='DEIMMosaic',
            output_size=inputs['output_size'],
            rotation_range=inputs['rotation_range'],
            translation_range=inputs['translation_range'],
            scaling_range=inputs['scaling_range']))
    canvas, boxes = mosaic.assemble(_mosaic_parts(example))
    height, width = canvas.shape[:2]
    affine = example['affine']
    assert affine['shear'] == [0.0, 0.0]
    matrix = mosaic_module.affine_matrix((width * 0.5, height * 0.5),
                                         affine['angle'], affine['translate'],
                                         affine['scale'])
    image = mosaic_module.warp_affine(canvas, matrix, 0)
    expected = np.array(example['image'], np.uint8)
    assert image.shape == expected.shape
    assert (image == expected).all()
    got = mosaic_module.affine_boxes(boxes, matrix, height, width)
    assert got == pytest.approx(np.array(example['boxes']), abs=1e-4)


def test_mosaic_runs_in_the_policy_dataset_and_draws_like_upstream():
    """End to end: ``get_indexes`` draws with ``random.choices`` (three
    indices, with replacement), and the output has every box of the four
    images (empty ones included)."""
    import_deim()
    example = upstream.repository(upstream.DEIM)['mosaic_example']
    parts = _mosaic_parts(example)
    mosaic = TRANSFORMS.build(dict(type='DEIMMosaic', output_size=6))
    random.seed(example['inputs']['seed'])
    assert mosaic.get_indexes(list(range(4))) == example['indices']
    results = dict(parts[0], mix_results=parts[1:])
    out = mosaic(results)
    assert len(out['gt_bboxes']) == sum(len(p['gt_bboxes']) for p in parts)
    assert out['img'].shape[:2] == out['img_shape']
    with pytest.raises(ValueError, match='MultiImageMixDataset'):
        mosaic(dict(parts[0]))


def _crop_results(boxes, size=(60, 80)):
    boxes = np.array(boxes, np.float32).reshape(-1, 4)
    return dict(
        img=np.zeros(size + (3, ), np.uint8),
        img_shape=size,
        gt_bboxes=HorizontalBoxes(boxes),
        gt_bboxes_labels=np.arange(len(boxes)),
        gt_ignore_flags=np.zeros(len(boxes), bool))


def test_iou_crop_never_crops_an_image_without_boxes():
    """torchvision's (so upstream's) IoU crop needs a box centre in the
    crop, so an image without boxes leaves only through the no-crop
    option; mmdet's ``MinIoURandomCrop`` crops it (negative control)."""
    import_deim()
    ours = TRANSFORMS.build(dict(type='RandomIoUCrop', prob=1.0))
    mmdet_crop = TRANSFORMS.build(dict(type='MinIoURandomCrop'))
    random.seed(0)
    np.random.seed(0)
    shapes = {ours(_crop_results([]))['img'].shape[:2] for _ in range(50)}
    assert shapes == {(60, 80)}
    mmdet_shapes = {
        mmdet_crop(_crop_results([]))['img'].shape[:2]
        for _ in range(50)
    }
    assert len(mmdet_shapes) > 1


def test_iou_crop_keeps_boxes_with_centres_inside_and_clips_them():
    import_deim()
    crop = TRANSFORMS.build(dict(type='RandomIoUCrop', prob=1.0))
    random.seed(1)
    boxes = [[5, 5, 30, 30], [40, 10, 75, 55], [0, 40, 10, 58]]
    cropped = 0
    for _ in range(200):
        out = crop(_crop_results(boxes))
        height, width = out['img'].shape[:2]
        assert out['img_shape'] == (height, width)
        kept = out['gt_bboxes'].cpu().numpy()
        assert len(kept) == len(out['gt_bboxes_labels']) == len(
            out['gt_ignore_flags'])
        if (height, width) == (60, 80):
            continue
        cropped += 1
        assert len(kept) >= 1
        assert (kept[:, 0::2] >= 0).all() and (kept[:, 0::2] <= width).all()
        assert (kept[:, 1::2] >= 0).all() and (kept[:, 1::2] <= height).all()
        # the crop's sides are independent fractions in [0.3, 1]
        assert 0.3 * 80 - 1 <= width and 0.3 * 60 - 1 <= height
        assert 0.5 <= width / height <= 2
    assert 50 < cropped < 200


def test_iou_crop_probability():
    import_deim()
    crop = TRANSFORMS.build(dict(type='RandomIoUCrop', prob=0.0))
    out = crop(_crop_results([[5, 5, 30, 30]]))
    assert out['img'].shape[:2] == (60, 80)
    with pytest.raises(ValueError, match='no crop'):
        TRANSFORMS.build(dict(type='RandomIoUCrop', sampler_options=[0.5]))


def _samples(targets, size=(16, 16)):
    samples = []
    for target in targets:
        sample = DetDataSample(metainfo=dict(img_shape=size, pad_shape=size))
        sample.gt_instances = InstanceData(
            bboxes=torch.tensor(target['boxes']).reshape(-1, 4),
            labels=torch.tensor(target['labels'], dtype=torch.int64))
        samples.append(sample)
    return samples


def test_mixup_equals_upstream_collate():
    """Same batch, epoch and seed as upstream's collate: the same mix
    weight (same draws, same order), mixed images and concatenated GT."""
    import_deim()
    example = upstream.repository(upstream.DEIM)['mixup_example']
    inputs = example['inputs']
    augment = MODELS.build(
        dict(
            type='CollateBatchAugment',
            mixup_prob=1.0,
            mixup_epochs=inputs['mixup_epochs']))
    augment.set_epoch(inputs['epoch'])
    random.seed(inputs['seed'])
    images, samples = augment(
        torch.tensor(inputs['images']), _samples(inputs['targets']))
    assert torch.allclose(images, torch.tensor(example['images']), atol=1e-6)
    for sample, target in zip(samples, example['targets']):
        boxes = torch.tensor(target['boxes']).reshape(-1, 4)
        assert torch.allclose(sample.gt_instances.bboxes, boxes)
        assert sample.gt_instances.labels.tolist() == target['labels']


def test_mixup_window_and_multiscale_stop():
    """MixUp only in ``[first, last)`` of ``mixup_epochs``; the random
    batch size only before ``stop_epoch``; the draws are made in
    upstream's order whether or not MixUp applies."""
    import_deim()
    augment = MODELS.build(
        dict(
            type='CollateBatchAugment',
            mixup_prob=1.0,
            mixup_epochs=[2, 4],
            scales=[32, 48],
            stop_epoch=5))
    targets = [
        dict(boxes=[[1., 1., 4., 4.]], labels=[0]),
        dict(boxes=[], labels=[])
    ]
    counts = {}
    sizes = {}
    for epoch in range(7):
        augment.set_epoch(epoch)
        seen = set()
        for _ in range(20):
            images, samples = augment(
                torch.rand(2, 3, 16, 16), _samples(targets))
            counts[epoch] = len(samples[1].gt_instances)
            seen.add(images.shape[-1])
        sizes[epoch] = seen
    assert counts == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0, 6: 0}
    assert all(sizes[e] == {32, 48} for e in range(5))
    assert sizes[5] == sizes[6] == {16}
