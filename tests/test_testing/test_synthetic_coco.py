import json
import os.path as osp

import numpy as np
import pytest

from mmddp_ext.testing import make_synthetic_coco
from mmddp_ext.testing.synthetic_coco import empty_mask
from mmddp_ext.utils import check_coco_file


def _boxes_per_image(root):
    with open(osp.join(root, 'annotations.json')) as f:
        data = json.load(f)
    counts = {img['id']: 0 for img in data['images']}
    for ann in data['annotations']:
        counts[ann['image_id']] += 1
    return data, counts


def test_odd_pattern_leaves_rank1_only_empty_images(tmp_path):
    make_synthetic_coco(str(tmp_path), num_images=10, empty='odd')
    data, counts = _boxes_per_image(str(tmp_path))
    assert all(counts[i] == 0 for i in range(1, 10, 2))
    assert all(counts[i] > 0 for i in range(0, 10, 2))
    check_coco_file(osp.join(str(tmp_path), 'annotations.json'))
    assert len(data['categories']) == 2


def test_mod_pattern_and_fraction():
    rng = np.random.default_rng(0)
    mask = empty_mask(9, 'mod3:1', rng)
    assert mask.nonzero()[0].tolist() == [1, 4, 7]
    assert empty_mask(20, 0.5, rng).sum() == 10
    assert not empty_mask(5, 'none', rng).any()
    assert empty_mask(5, 'all', rng).all()


def test_same_seed_same_dataset(tmp_path):
    a = make_synthetic_coco(str(tmp_path / 'a'), num_images=6, seed=3)
    b = make_synthetic_coco(str(tmp_path / 'b'), num_images=6, seed=3)
    assert _boxes_per_image(a['data_root'])[0] == _boxes_per_image(
        b['data_root'])[0]


def test_bad_empty_pattern_is_refused(tmp_path):
    with pytest.raises(ValueError, match="empty must be"):
        make_synthetic_coco(str(tmp_path), empty='sometimes')


def test_polygons_outline_each_shape_inside_its_box(tmp_path):
    from pycocotools import mask as mask_utils
    make_synthetic_coco(str(tmp_path), num_images=8, empty='none',
                        classes=('square', 'disc', 'triangle'))
    data, _ = _boxes_per_image(str(tmp_path))
    areas = {}
    for ann in data['annotations']:
        x0, y0, w, h = ann['bbox']
        (polygon, ) = ann['segmentation']
        xs, ys = polygon[0::2], polygon[1::2]
        assert len(xs) >= 3
        # Pixel coordinates; cv2 draws a disc of even width 1 px wider.
        assert x0 <= min(xs) and max(xs) <= x0 + w
        assert y0 <= min(ys) and max(ys) <= y0 + h
        rle = mask_utils.frPyObjects([polygon], 96, 96)
        shape = ann['category_id']
        areas.setdefault(shape, []).append(
            float(mask_utils.area(rle).sum()) / (w * h))
    # Filled fractions of the box: square ~1, disc ~pi/4, triangle ~1/2.
    assert min(areas[1]) > 0.85
    assert 0.65 < min(areas[2]) and max(areas[2]) < 0.9
    assert 0.35 < min(areas[3]) and max(areas[3]) < 0.6
