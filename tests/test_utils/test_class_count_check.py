"""Class-count check: every num_classes in the model config against the
dataset's classes, before anything is built (issue 13)."""
import os.path as osp

import pytest
from mmengine.config import Config

from mmddp_ext.utils import check_class_counts, check_config_class_counts
from mmddp_ext.utils.class_count_check import (is_class_agnostic,
                                               num_classes_keys,
                                               predicts_segmentation_maps)

from ..helpers import REPO_ROOT

CO_DINO_TINY = osp.join(REPO_ROOT, 'configs', 'co_dino_tiny.py')
CO_DINO_HEAD_KEYS = ('model.query_head.num_classes',
                     'model.roi_head[0].bbox_head.num_classes',
                     'model.bbox_head[0].num_classes')
THREE = ('square', 'disc', 'triangle')


def _set_classes(cfg, classes):
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].dataset.metainfo = dict(classes=classes)


def test_co_dino_mismatch_names_every_head_and_both_numbers():
    import mmddp_ext  # noqa: F401
    cfg = Config.fromfile(CO_DINO_TINY)
    check_config_class_counts(cfg)  # 2 heads' classes, 2 dataset classes
    _set_classes(cfg, THREE)
    with pytest.raises(ValueError) as error:
        check_config_class_counts(cfg)
    message = str(error.value)
    for key in CO_DINO_HEAD_KEYS:
        assert f'{key}=2' in message
    assert 'the dataset has 3 classes' in message
    assert 'train_dataloader.dataset.metainfo.classes' in message
    # The fix, spelled as --cfg-options accepts it.
    assert 'model.roi_head.0.bbox_head.num_classes=3' in message
    # The RPN head is class-agnostic by design: never reported.
    assert 'rpn_head' not in message


def test_rpn_heads_are_class_agnostic_through_their_mro():
    import mmdet.models  # noqa: F401
    from mmdet.models.dense_heads import (ATSSHead, GARPNHead, RPNHead,
                                          StageCascadeRPNHead)
    from mmdet.models.roi_heads.bbox_heads import Shared2FCBBoxHead
    from mmdet.models.roi_heads.mask_heads import (FCNMaskHead,
                                                   FusedSemanticHead)
    assert is_class_agnostic(RPNHead)
    assert is_class_agnostic(GARPNHead)
    # Its own __init__ does not name num_classes: the MRO leads to
    # RPNHead's.
    assert is_class_agnostic(StageCascadeRPNHead)
    for head in (ATSSHead, Shared2FCBBoxHead, FCNMaskHead):
        assert not is_class_agnostic(head)
        assert not predicts_segmentation_maps(head)
    # HTC's semantic head predicts the 183 classes of its segmentation
    # maps, not the dataset's instance classes.
    assert predicts_segmentation_maps(FusedSemanticHead)

    model = dict(
        type='FasterRCNN',
        rpn_head=dict(type='RPNHead', num_classes=1),
        roi_head=dict(bbox_head=dict(type='Shared2FCBBoxHead', num_classes=3)))
    assert num_classes_keys(
        model, scope='mmdet') == [('model.roi_head.bbox_head.num_classes', 3)]


def _set_leaf_classes(dataset, classes):
    """Set metainfo.classes inside wrappers (VOC: RepeatDataset of a
    ConcatDataset)."""
    if 'datasets' in dataset:
        for child in dataset.datasets:
            _set_leaf_classes(child, classes)
    elif 'dataset' in dataset:
        _set_leaf_classes(dataset.dataset, classes)
    else:
        dataset.metainfo = dict(classes=classes)


def zoo_config(name: str) -> str:
    """Path of an installed MMDetection model-zoo config."""
    import mmdet
    return osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', name)


@pytest.mark.parametrize(
    'config',
    [
        'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
        'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
        'cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py',
        'dino/dino-4scale_r50_8xb2-12e_coco.py',
        'pascal_voc/faster-rcnn_r50_fpn_1x_voc0712.py',
        'htc/htc_r50_fpn_1x_coco.py',  # 183-class semantic head
        'panoptic_fpn/panoptic-fpn_r50_fpn_1x_coco.py',  # 80 things
        'faster_rcnn/faster-rcnn_r50_fpn_fcos-rpn_1x_coco.py',
    ])
def test_zoo_configs_with_correct_counts_pass(config):
    cfg = Config.fromfile(zoo_config(config))
    check_config_class_counts(cfg)
    # ... and a 3-class dataset is caught in each of them.
    _set_leaf_classes(cfg.train_dataloader.dataset, THREE)
    with pytest.raises(ValueError, match='the dataset has 3 classes'):
        check_config_class_counts(cfg, splits=('train', ))


def test_dataset_wrappers_and_registered_metainfo():
    model = dict(bbox_head=dict(type='DINOHead', num_classes=2))
    coco = dict(type='CocoDataset')  # classes from CocoDataset.METAINFO
    two = dict(type='CocoDataset', metainfo=dict(classes=('a', 'b')))
    check_class_counts(model, {'train_dataloader': dict(dataset=two)}, 'mmdet')
    wrapped = dict(
        type='ClassBalancedDataset',
        oversample_thr=0.1,
        dataset=dict(
            type='ConcatDataset',
            datasets=[two,
                      dict(type='RepeatDataset', times=2, dataset=coco)]))
    with pytest.raises(ValueError) as error:
        check_class_counts(model, {'train_dataloader': dict(dataset=wrapped)},
                           'mmdet')
    message = str(error.value)
    assert 'the dataset has 80 classes' in message
    assert ('train_dataloader.dataset.dataset.datasets[1].dataset '
            '(CocoDataset.METAINFO)') in message
    assert 'model.bbox_head.num_classes=2' in message


def test_text_prompted_and_tracking_models_are_not_compared(capsys):
    """Their num_classes is no dataset class count: Grounding DINO's is
    the text-token capacity (256), a tracker filters its categories."""
    loaders = {
        'train_dataloader':
        dict(dataset=dict(type='CocoDataset', metainfo=dict(classes=THREE)))
    }
    for model_type in ('GroundingDINO', 'ByteTrack'):
        check_class_counts(
            dict(type=model_type, bbox_head=dict(num_classes=256)), loaders,
            'mmdet')
    with pytest.raises(ValueError):
        check_class_counts(
            dict(type='DINO', bbox_head=dict(num_classes=256)), loaders,
            'mmdet')


def test_built_dataloaders_and_models_are_read_or_skipped():

    class Loader:
        dataset = type('Dataset', (), {'metainfo': {'classes': THREE}})()

    model = dict(bbox_head=dict(type='DINOHead', num_classes=2))
    with pytest.raises(ValueError, match='the dataset has 3 classes'):
        check_class_counts(model, {'val_dataloader': Loader()}, 'mmdet')
    import torch.nn as nn
    check_class_counts(nn.Linear(1, 1), {'val_dataloader': Loader()})
