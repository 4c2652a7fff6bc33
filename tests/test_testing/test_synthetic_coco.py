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
