"""Every shipped real-time DETR config (RT-DETR, D-FINE, DEIM, DEIMv2)
keeps a training image whose boxes all filter out (after a crop, a mosaic
or the minimum box size), with no boxes, as upstream's
``SanitizeBoundingBoxes`` does. (CO-DINO keeps MMDetection's default, as
upstream CO-DETR on MMDetection 2.x.)

MMDetection's ``FilterAnnotations(keep_empty=True)`` means the opposite:
the transform returns None, the dataset re-draws another sample, and a
rank whose images are mostly GT-less runs out of tries ("The training
pipeline of the dataset wrapper always return None"), seen with DEIM's
Mosaic policy on 2 ranks, rank 1 reading GT-less images only."""
import glob
import os.path as osp

import numpy as np
import pytest
from mmdet.structures.bbox import HorizontalBoxes
from mmengine.config import Config

from ..helpers import REPO_ROOT
from .config_files import leaf_datasets


REALTIME_PROJECTS = ('projects/RT-DETR/', 'projects/D-FINE/',
                     'projects/DEIM/', 'projects/DEIMv2/', 'configs/rtdetr')


def _filters(node):
    """Every ``FilterAnnotations`` config inside ``node``."""
    if isinstance(node, dict):
        if node.get('type') == 'FilterAnnotations':
            yield node
        for value in node.values():
            yield from _filters(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _filters(value)


def _configs_with_filters():
    """The configs (bases included) that write a ``FilterAnnotations``
    themselves; the others inherit one of these pipelines."""
    found = {}
    paths = glob.glob(f'{REPO_ROOT}/projects/*/configs/**/*.py',
                      recursive=True) + glob.glob(f'{REPO_ROOT}/configs/*.py')
    for path in sorted(paths):
        path = osp.relpath(path, REPO_ROOT)
        if not path.startswith(REALTIME_PROJECTS) or (
                'FilterAnnotations' not in open(f'{REPO_ROOT}/{path}').read()):
            continue
        cfg = Config.fromfile(f'{REPO_ROOT}/{path}')
        loader = cfg.get('train_dataloader') or {}
        nodes = [d for _, d in leaf_datasets(loader.get('dataset'), 'd')]
        nodes.append(loader.get('dataset'))
        filters = [f for node in nodes for f in _filters(node)]
        if filters:
            found[path] = filters
    return found


def _all_boxes_filtered(filter_cfg: dict):
    """The transform on an image whose only box is below the minimum."""
    from mmdet.registry import TRANSFORMS
    transform = TRANSFORMS.build(dict(filter_cfg))
    min_w, min_h = filter_cfg.get('min_gt_bbox_wh', (1, 1))
    tiny = np.array([[10, 10, 10 + min_w / 2, 10 + min_h / 2]],
                    dtype=np.float32)
    return transform(
        dict(
            img=np.zeros((32, 32, 3), np.uint8),
            gt_bboxes=HorizontalBoxes(tiny),
            gt_bboxes_labels=np.array([0]),
            gt_ignore_flags=np.array([False])))


def test_an_image_whose_boxes_all_filter_out_is_kept_without_boxes():
    import mmdet.datasets  # noqa: F401 (registers the transforms)
    configs = _configs_with_filters()
    assert len(configs) >= 8, sorted(configs)  # RT-DETR, DEIM, DEIMv2
    for path, filters in configs.items():
        for filter_cfg in filters:
            kept = _all_boxes_filtered(filter_cfg)
            assert kept is not None, (path, filter_cfg)
            assert len(kept['gt_bboxes']) == 0, (path, filter_cfg)


@pytest.mark.parametrize('keep_empty', [True])
def test_control_keep_empty_true_drops_the_sample(keep_empty):
    import mmdet.datasets  # noqa: F401
    dropped = _all_boxes_filtered(
        dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1),
             keep_empty=keep_empty))
    assert dropped is None
