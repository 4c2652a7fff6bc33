"""The doctor's ``--shrink`` (``mmddp_ext.doctor.shrink.shrink_config``) on
mixing pipelines: RandomAffine's ``border`` is an offset from the size of
the mosaic it receives, so it shrinks with the pipeline's images, and the
model's ``BatchSyncRandomResize`` range shrinks like an image size."""
import random

import numpy as np
import pytest

from mmddp_ext.doctor import shrink
from mmddp_ext.doctor.shrink import shrink_config
from mmddp_ext.testing import make_synthetic_coco
from ..test_model_zoo.zoo_cases import (CLASSES, IMAGE_SIZE, YOLOX_MOSAIC,
                                        zoo_config_path)


def test_offsets_shrink_by_their_dataloaders_factor():
    """Sizes shrink to the short side; ``border`` by the factor that shrank
    the largest images of its dataloader; pixel pairs that are not sizes
    (``min_gt_bbox_wh``) and ratios stay."""
    from mmengine.config import Config
    cfg = Config(
        dict(
            model=dict(
                data_preprocessor=dict(batch_augments=[
                    dict(
                        type='BatchSyncRandomResize',
                        random_size_range=(480, 800),
                        size_divisor=32)
                ])),
            train_dataloader=dict(
                batch_size=8,
                dataset=dict(pipeline=[
                    dict(type='Mosaic', img_scale=(640, 640)),
                    dict(
                        type='RandomAffine',
                        scaling_ratio_range=(0.1, 2),
                        border=(-320, -320)),
                    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1)),
                ])),
            test_dataloader=dict(
                dataset=dict(pipeline=[
                    dict(
                        type='RandomCenterCropPad',
                        crop_size=(512, 512),
                        border=128),
                ]))))
    shrink_config(cfg, short_side=64, max_batch=2)
    mosaic, affine, filt = cfg.train_dataloader.dataset.pipeline
    assert mosaic.img_scale == (64, 64)
    assert affine.border == (-32, -32)
    assert affine.scaling_ratio_range == (0.1, 2)
    assert filt.min_gt_bbox_wh == (1, 1)
    crop_pad = cfg.test_dataloader.dataset.pipeline[0]
    assert (crop_pad.crop_size, crop_pad.border) == ((64, 64), 16)
    resize = cfg.model.data_preprocessor.batch_augments[0]
    assert resize.random_size_range == (64, 106)
    assert cfg.train_dataloader.batch_size == 2


def _mosaic_then_affine(data_root: str):
    """MultiImageMixDataset with the shrunk YOLOX-S config's first two
    transforms (Mosaic, RandomAffine) on the synthetic data."""
    from mmdet.registry import DATASETS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    init_default_scope('mmdet')
    cfg = Config.fromfile(
        zoo_config_path(YOLOX_MOSAIC.config), import_custom_modules=False)
    shrink_config(cfg, short_side=IMAGE_SIZE, max_batch=1)
    dataset = cfg.train_dataloader.dataset
    assert [t.type for t in dataset.pipeline[:2]] == ['Mosaic', 'RandomAffine']
    dataset.pipeline = dataset.pipeline[:2]
    dataset.dataset.update(
        data_root=data_root,
        ann_file='annotations.json',
        data_prefix=dict(img='images/'),
        metainfo=dict(classes=CLASSES),
        filter_cfg=dict(filter_empty_gt=False, min_size=1))
    return DATASETS.build(dataset)


@pytest.mark.parametrize(
    'shrink_border', [True, False], ids=['shrunk', 'border_kept_control'])
def test_shrunk_yolox_mosaic_keeps_boxes(shrink_border, tmp_path, monkeypatch):
    """The shrunk YOLOX-S Mosaic and RandomAffine under the real
    MultiImageMixDataset, on images half of which have no boxes: 64-px
    outputs, most with boxes, those of GT-less sampled images too.
    Control: with ``border`` left at YOLOX's -320 px, as the doctor shrank
    it before, RandomAffine crops the whole 128-px mosaic away and every
    sample comes out without boxes (what the first model-zoo trial of
    YOLOX saw)."""
    if not shrink_border:
        monkeypatch.setattr(shrink, 'OFFSET_KEYS', ())
    make_synthetic_coco(
        str(tmp_path), num_images=4, image_size=IMAGE_SIZE, empty='odd')
    dataset = _mosaic_then_affine(str(tmp_path))
    shapes, boxes = set(), {}  # boxes: index -> count per seed
    for seed in range(8):
        random.seed(seed)
        np.random.seed(seed)
        for index in range(len(dataset)):
            out = dataset[index]
            shapes.add(out['img'].shape[:2])
            boxes.setdefault(index, []).append(len(out['gt_bboxes']))
    if shrink_border:
        assert shapes == {(IMAGE_SIZE, IMAGE_SIZE)}
        assert sum(n > 0 for n in sum(boxes.values(), [])) > 16, boxes
        # The odd images have no boxes; tiled with others, they get some.
        assert any(boxes[1]) and any(boxes[3]), boxes
    else:
        assert shapes == {(2 * IMAGE_SIZE, 2 * IMAGE_SIZE)}
        assert not any(sum(boxes.values(), [])), boxes


def test_shrunk_sizes_keep_their_divisibility():
    """DEIMv2's DINOv3 sizes need sides that are multiples of 16: its
    multi-scale sides (multiples of 32) stay multiples of 32 when shrunk
    (the doctor's probe ran into a 136-px batch as a false blocker); a
    (width, height) pair keeps its aspect ratio as before."""
    sides = [480 + 32 * k for k in range(11)]
    shrunk = shrink._shrink_size(sides, 128)
    assert shrunk[0] == 128 and all(s % 32 == 0 for s in shrunk), shrunk
    assert shrink._shrink_size((640, 640), 128) == (128, 128)
    assert shrink._shrink_size((1333, 800), 128) == (213, 128)
    assert shrink._shrink_size([640, 672, 800], 128) == [128, 128, 160]
    assert shrink._shrink_size([640, 680, 800], 128) == [128, 136, 160]
