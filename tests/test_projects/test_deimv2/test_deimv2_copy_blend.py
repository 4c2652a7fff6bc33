"""DEIMv2's Copy-Blend (``DEIMv2CollateBatchAugment``) on small synthetic
batches (the configs' values against upstream's YAML are checked in
``test_deimv2_recipes.py``).

The expected values are built from upstream's rules (``BatchImageCollate
Function.apply_mixup`` in DEIMv2's ``engine/data/dataloader.py``): the
first draw of a batch is the mix weight, MixUp's draw comes next, Copy-Blend
is tried only when MixUp does not apply and only inside its window."""
import random

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.config import Config
from mmengine.structures import InstanceData

from .deimv2_utils import PROJECT, import_project
from .test_deimv2_recipes import copy_blend_differences, records


def augment(**keys):
    import_project()
    from projects.DEIMv2.deimv2 import DEIMv2CollateBatchAugment
    built = DEIMv2CollateBatchAugment(
        **dict(dict(copyblend_prob=1.0, copyblend_epochs=[0, 1]), **keys))
    built.set_epoch(0)
    return built


def samples(targets, size, box_type=HorizontalBoxes):
    out = []
    for boxes, labels in targets:
        sample = DetDataSample(metainfo=dict(img_shape=size, pad_shape=size))
        tensor = torch.tensor(boxes, dtype=torch.float64).reshape(-1, 4)
        sample.gt_instances = InstanceData(
            bboxes=box_type(tensor) if box_type else tensor,
            labels=torch.tensor(labels, dtype=torch.int64))
        out.append(sample)
    return out


def boxes_of(sample):
    bboxes = sample.gt_instances.bboxes
    return (bboxes.tensor
            if isinstance(bboxes, HorizontalBoxes) else bboxes).tolist()


def first_weight(seed):
    """The mix weight a batch run right after ``random.seed(seed)`` uses."""
    random.seed(seed)
    return round(random.uniform(0.45, 0.55), 6)


def region_mask(shape, x1, y1, x2, y2):
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[..., y1:y2, x1:x2] = True
    return mask


@pytest.mark.parametrize('seed', [0, 1, 2])
def test_blend_pastes_the_weighted_mix_and_appends_the_box(seed):
    """One pooled object (image 0's), pasted into both images; image 1 has
    no GT and gets the object. Its pixels become ``target * beta + source *
    (1 - beta)``; nothing else changes."""
    height, width = 20, 24
    inputs = torch.rand(2, 3, height, width, dtype=torch.float64)
    # int-truncated: columns 2..8, rows 3..9 (6 x 6)
    batch = samples([([[2.5, 3.5, 8.7, 9.9]], [5]), ([], [])], (height, width))
    beta = first_weight(seed)
    random.seed(seed)
    out, batch = augment(area_threshold=10, num_objects=1)(inputs, batch)
    source = inputs[0, :, 3:9, 2:8]
    for index, sample in enumerate(batch):
        pasted = boxes_of(sample)[-1]
        x1, y1, x2, y2 = map(int, pasted)
        assert pasted == [x1, y1, x2, y2] and (x2 - x1, y2 - y1) == (6, 6)
        assert sample.gt_instances.labels.tolist()[-1] == 5
        expected = inputs[index].clone()
        expected[:, y1:y2, x1:x2] = (
            inputs[index, :, y1:y2, x1:x2] * beta + source * (1 - beta))
        assert torch.allclose(out[index], expected, rtol=0, atol=1e-12)
        changed = (out[index] != inputs[index]).any(0)
        assert changed.any() and not (
            changed
            & ~region_mask(changed.shape, x1, y1, x2, y2)).any()
    assert boxes_of(batch[0])[0] == [2.5, 3.5, 8.7, 9.9]
    assert [len(s.gt_instances) for s in batch] == [2, 1]


def test_copy_with_expansion_moves_the_grown_region():
    """``'copy'`` with ``expand_ratios`` (0.5, 0.5): the source region grown
    by 3 px (half the 6-px side) on each side, less at either image's
    border, replaces the target's pixels; the appended box is the
    unexpanded one."""
    height, width = 30, 32
    inputs = torch.rand(1, 3, height, width, dtype=torch.float64)
    batch = samples([([[8.2, 6.1, 14.9, 12.4]], [7])], (height, width),
                    box_type=None)
    src_x1, src_y1, src_x2, src_y2 = 8, 6, 14, 12
    for seed in range(6):
        random.seed(seed)
        out, result = augment(
            copyblend_type='copy',
            area_threshold=1,
            with_expand=True,
            expand_ratios=[0.5, 0.5])(inputs, [s.clone() for s in batch])
        x1, y1, x2, y2 = map(int, boxes_of(result[0])[-1])
        assert (x2 - x1, y2 - y1) == (6, 6)
        left, top = min(3, src_x1, x1), min(3, src_y1, y1)
        right = min(3, width - src_x2, width - x2)
        bottom = min(3, height - src_y2, height - y2)
        expected = inputs[0].clone()
        expected[:, y1 - top:y2 + bottom,
                 x1 - left:x2 + right] = inputs[0, :,
                                                src_y1 - top:src_y2 + bottom,
                                                src_x1 - left:src_x2 + right]
        assert torch.equal(out[0], expected)
        assert result[0].gt_instances.labels.tolist() == [7, 7]


def test_area_threshold_picks_the_pool():
    """Only boxes whose area reaches ``area_threshold`` (inclusive) are
    pasted; above every box's area nothing changes."""
    height, width = 24, 24
    inputs = torch.rand(2, 3, height, width)
    small, large = [1.0, 1.0, 5.0, 5.0], [12.0, 12.0, 22.0, 22.0]
    targets = [([small, large], [1, 2]), ([], [])]
    for seed in range(5):
        random.seed(seed)
        out, batch = augment(
            area_threshold=100, num_objects=3)(inputs,
                                               samples(targets,
                                                       (height, width)))
        appended = [s.gt_instances.labels.tolist() for s in batch]
        assert appended == [[1, 2, 2], [2]]
        x1, y1, x2, y2 = boxes_of(batch[1])[0]
        assert (x2 - x1, y2 - y1) == (10, 10)
    random.seed(0)
    out, batch = augment(area_threshold=100.5)(inputs,
                                               samples(targets,
                                                       (height, width)))
    assert torch.equal(out, inputs)
    assert [len(s.gt_instances) for s in batch] == [2, 0]


def test_epoch_window_and_probability():
    """Copy-Blend only in ``[first, last)`` of ``copyblend_epochs``, and
    outside it no Copy-Blend draw is made (upstream tests the window
    first); with ``copyblend_prob`` 0 nothing changes inside it. Fails if
    the window test is dropped."""
    height, width = 16, 16
    inputs = torch.rand(2, 3, height, width)
    targets = [([[1.0, 1.0, 12.0, 12.0]], [3]), ([], [])]
    on = augment(copyblend_epochs=[2, 4], area_threshold=1)
    changed = {}
    for epoch in range(6):
        on.set_epoch(epoch)
        random.seed(epoch)
        out, batch = on(inputs, samples(targets, (height, width)))
        changed[epoch] = not torch.equal(out, inputs)
        assert [len(s.gt_instances)
                for s in batch] == ([2, 1] if changed[epoch] else [1, 0])
        if not changed[epoch]:
            after = random.getstate()
            random.seed(epoch)
            random.random(), random.random()  # the mix weight, MixUp's
            assert after == random.getstate()
    assert changed == {
        0: False,
        1: False,
        2: True,
        3: True,
        4: False,
        5: False
    }
    off = augment(copyblend_prob=0.0, area_threshold=1)
    for seed in range(10):
        random.seed(seed)
        out, batch = off(inputs, samples(targets, (height, width)))
        assert torch.equal(out, inputs)
        assert [len(s.gt_instances) for s in batch] == [1, 0]


def test_mixup_first_copy_blend_otherwise():
    """Both on with probability 1: MixUp applies (with the second weight
    drawn) and Copy-Blend does not; once MixUp's window has closed,
    Copy-Blend applies."""
    height, width = 16, 16
    inputs = torch.rand(2, 3, height, width, dtype=torch.float64)
    targets = [([[1.0, 1.0, 12.0, 12.0]], [3]), ([[2.0, 2.0, 9.0, 9.0]], [4])]
    both = augment(
        mixup_prob=1.0,
        mixup_epochs=[0, 1],
        copyblend_epochs=[0, 2],
        area_threshold=1)
    random.seed(4)
    random.uniform(0, 1), random.random()
    beta = round(random.uniform(0.45, 0.55), 6)
    random.seed(4)
    out, batch = both(inputs, samples(targets, (height, width)))
    mixed = inputs * beta + inputs.roll(1, 0) * (1 - beta)
    assert torch.allclose(out, mixed, rtol=0, atol=1e-12)
    assert [s.gt_instances.labels.tolist() for s in batch] == [[3, 4], [4, 3]]
    both.set_epoch(1)
    random.seed(4)
    out, batch = both(inputs, samples(targets, (height, width)))
    assert [len(s.gt_instances) for s in batch] == [3, 3]


def test_batch_without_gt_is_left_alone():
    """No GT anywhere: the batch is unchanged and, as upstream returns once
    the pool is empty, only the three draws before it are made."""
    inputs = torch.rand(3, 3, 8, 8)
    random.seed(1)
    out, batch = augment(area_threshold=0)(inputs,
                                           samples([([], [])] * 3, (8, 8)))
    after = random.getstate()
    assert torch.equal(out, inputs)
    assert all(len(s.gt_instances) == 0 for s in batch)
    random.seed(1)
    random.random(), random.random(), random.random()
    assert after == random.getstate()


@pytest.mark.parametrize('key,value', [
    ('copyblend_type', 'paste'),
    ('copyblend_prob', 1.5),
    ('copyblend_epochs', '4-120'),
    ('num_objects', 0),
    ('area_threshold', -1),
    ('with_expand', 'yes'),
    ('expand_ratios', [0.25, 0.1]),
    ('random_num_objects', None),
])
def test_bad_keys_are_named(key, value):
    with pytest.raises(ValueError) as error:
        augment(**{key: value})
    assert key in str(error.value) and repr(value) in str(error.value)


def test_custom_config_keeps_copy_blend():
    """The custom configs take their COCO config's batch augment (N's, the
    one size with probability 0.4, as the example); the COCO configs'
    values are checked against upstream's YAML in
    ``test_deimv2_recipes.py``."""
    (batch_augment,
     ) = Config.fromfile(f'{PROJECT}/configs/deimv2_hgnetv2_n_custom.py'
                         ).model.data_preprocessor.batch_augments
    collate = records()['hgnetv2_n']['yaml']['collate_fn']
    assert batch_augment['type'] == 'DEIMv2CollateBatchAugment'
    assert copy_blend_differences(batch_augment, collate) == {}
