import json

import pytest
from mmengine.config import Config

from mmddp_ext.utils import check_coco_file, check_config_annotations
from mmddp_ext.utils.coco_check import config_ann_files


def _write(tmp_path, text, name='ann.json'):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_invalid_json_names_file_and_position(tmp_path):
    path = _write(tmp_path, '{"images": [}')
    with pytest.raises(ValueError) as info:
        check_coco_file(path)
    assert path in str(info.value)
    assert 'not valid JSON' in str(info.value) and 'line 1' in str(info.value)


@pytest.mark.parametrize('data, problem', [
    ([], 'top level is a list'),
    ({'images': [], 'categories': []}, '"annotations" is missing'),
    ({'images': [{'id': 1, 'file_name': 'a.png'}], 'categories': [{'id': 1}],
      'annotations': [{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 5]}]},
     'expected [x, y, width, height]'),
    ({'images': [{'id': 1, 'file_name': 'a.png'}], 'categories': [{'id': 1}],
      'annotations': [{'image_id': 2, 'category_id': 1,
                       'bbox': [0, 0, 5, 5]}]}, 'image_id 2 is not'),
    ({'images': [{'id': 1, 'file_name': 'a.png'}], 'categories': [{'id': 1}],
      'annotations': [{'image_id': 1, 'category_id': 1,
                       'bbox': [0, 0, -5, 5]}]}, 'negative width'),
])
def test_malformed_coco_is_named(tmp_path, data, problem):
    path = _write(tmp_path, json.dumps(data))
    with pytest.raises(ValueError) as info:
        check_coco_file(path)
    assert path in str(info.value) and problem in str(info.value)


def test_missing_file_and_config_key_are_named(tmp_path):
    cfg = Config(dict(train_dataloader=dict(dataset=dict(
        type='CocoDataset', data_root=str(tmp_path) + '/',
        ann_file='missing.json'))))
    with pytest.raises(ValueError) as info:
        check_config_annotations(cfg)
    assert 'train_dataloader.dataset.ann_file' in str(info.value)
    assert 'missing.json does not exist' in str(info.value)


VALID_COCO = {
    'images': [{'id': 1, 'file_name': 'a.png'}],
    'categories': [{'id': 1, 'name': 'x'}],
    'annotations': [{'image_id': 1, 'category_id': 1, 'bbox': [0, 0, 5, 5]}]
}


def test_valid_file_passes_and_the_same_file_broken_does_not(tmp_path):
    path = _write(tmp_path, json.dumps(VALID_COCO))
    assert check_coco_file(path) is None
    broken = dict(VALID_COCO, annotations=[
        dict(VALID_COCO['annotations'][0], bbox=[0, 0, 5, -5])])
    _write(tmp_path, json.dumps(broken))
    with pytest.raises(ValueError, match='negative width or height'):
        check_coco_file(path)


def test_config_check_reads_every_split_and_names_the_key(tmp_path):
    _write(tmp_path, json.dumps(VALID_COCO), 'train.json')
    _write(tmp_path, json.dumps(VALID_COCO), 'val.json')
    root = str(tmp_path) + '/'
    cfg = Config(dict(
        train_dataloader=dict(dataset=dict(
            type='RepeatDataset', dataset=dict(
                type='CocoDataset', data_root=root, ann_file='train.json'))),
        val_dataloader=dict(dataset=dict(
            type='CocoDataset', data_root=root, ann_file='val.json')),
        val_evaluator=dict(type='CocoMetric', ann_file=root + 'val.json')))
    assert config_ann_files(cfg) == [
        ('train_dataloader.dataset.ann_file', root + 'train.json'),
        ('val_dataloader.dataset.ann_file', root + 'val.json'),
        ('val_evaluator.ann_file', root + 'val.json'),
    ]
    assert check_config_annotations(cfg) is None
    _write(tmp_path, '{"images": ', 'val.json')
    with pytest.raises(ValueError, match=r'^val_dataloader\.dataset\.ann_'
                       r'file: annotation file .*val\.json is not valid JSON'):
        check_config_annotations(cfg)
    # tools/test.py checks the test split only.
    assert check_config_annotations(cfg, splits=('test', )) is None
