"""The model-zoo matrix: configs from MMDetection's installed model zoo
(``mmdet::...``), each with the opt-in recipe added to its ``_base_`` and
shrunk for a 2-core CPU through overrides only: a smaller backbone and
head, and the config's own training pipeline with every image size
scaled down (``mmddp_ext.doctor.shrink``), so that its transforms
(multi-scale choices, crops) meet the GT-less images. docs/
model_zoo_matrix.md lists the same table."""
import os.path as osp
from typing import Dict, List, NamedTuple

from ..helpers import REPO_ROOT

RECIPE = osp.join(REPO_ROOT, 'configs', '_base_', 'mmddp_ext.py')
CODETR_STYLE = osp.join(
    osp.dirname(osp.abspath(__file__)), 'configs',
    'co_dino_r18_codetr_style.py')
CLASSES = ('square', 'disc')
IMAGE_SIZE = 64
# Two ranks, one image per batch, one epoch: 2 iterations per rank. With
# an unshuffled sampler rank r reads images r, r + 2: rank 1 reads only
# the empty odd-indexed ones (make_synthetic_coco(empty='odd')).
WORLD_SIZE = 2
NUM_IMAGES = 4
ITERS = NUM_IMAGES // WORLD_SIZE

# ResNet-18 from scratch (no pretrained download) for the zoo's ResNet-50.
R18 = dict(depth=18, init_cfg=None)
R18_FPN = dict(in_channels=[64, 128, 256, 512])
R18_LAST3 = dict(in_channels=[128, 256, 512])
HEAD = dict(num_classes=len(CLASSES))


class ZooCase(NamedTuple):
    """One row of the matrix.

    Args:
        name (str): Test id and README row.
        config (str): The config, ``mmdet::`` path or file.
        model (dict): Overrides merged into ``model`` (shrinking only).
    """
    name: str
    config: str
    model: Dict


def _detr(queries: int, neck: Dict, **more) -> Dict:
    """DETR-family shrink: ResNet-18, one encoder and one decoder layer,
    ``queries`` queries."""
    return dict(
        backbone=R18,
        neck=neck,
        num_queries=queries,
        encoder=dict(num_layers=1),
        decoder=dict(num_layers=1),
        bbox_head=HEAD,
        **more)


CASES: List[ZooCase] = [
    ZooCase('dino', 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
            _detr(20, R18_LAST3,
                  dn_cfg=dict(group_cfg=dict(num_dn_queries=10)))),
    ZooCase('deformable_detr',
            'mmdet::deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
            _detr(20, R18_LAST3)),
    ZooCase('conditional_detr',
            'mmdet::conditional_detr/conditional-detr_r50_8xb2-50e_coco.py',
            _detr(20, dict(in_channels=[512]))),
    ZooCase('dab_detr', 'mmdet::dab_detr/dab-detr_r50_8xb2-50e_coco.py',
            _detr(20, dict(in_channels=[512]))),
    ZooCase('faster_rcnn', 'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
            dict(backbone=R18, neck=R18_FPN,
                 roi_head=dict(bbox_head=HEAD))),
    # ResNeXt's smallest depth is 50; with_cp checkpoints every block.
    ZooCase('retinanet_x101_with_cp',
            'mmdet::retinanet/retinanet_x101-64x4d_fpn_1x_coco.py',
            dict(backbone=dict(depth=50, with_cp=True, init_cfg=None),
                 bbox_head=HEAD)),
    ZooCase('mask_rcnn', 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
            dict(backbone=R18, neck=R18_FPN,
                 roi_head=dict(bbox_head=HEAD, mask_head=HEAD))),
    ZooCase('atss', 'mmdet::atss/atss_r50_fpn_1x_coco.py',
            dict(backbone=R18, neck=R18_FPN, bbox_head=HEAD)),
    # Its base sets custom_imports, as upstream CO-DETR's configs do; the
    # model is CPU-sized already.
    ZooCase('co_dino_codetr_style', CODETR_STYLE, dict()),
]

# YOLOX-S: Mosaic, RandomAffine, MixUp and YOLOXHSVRandomAug under
# MultiImageMixDataset, and BatchSyncRandomResize in the model. Not in
# CASES (two entry points would cost two launches): test_zoo_mosaic.py
# trains it through tools/dist_train.sh. CSPDarknet at an eighth of its
# width (YOLOX-S: a half).
YOLOX_MOSAIC = ZooCase(
    'yolox_mosaic', 'mmdet::yolox/yolox_s_8xb8-300e_coco.py',
    dict(backbone=dict(widen_factor=0.125),
         neck=dict(in_channels=[32, 64, 128], out_channels=32),
         bbox_head=dict(in_channels=32, feat_channels=32, **HEAD)))


def zoo_config_path(config: str) -> str:
    """A file path for ``mmdet::`` configs (the installed model zoo)."""
    if not config.startswith('mmdet::'):
        return config
    import mmdet
    return osp.join(
        osp.dirname(mmdet.__file__), '.mim', 'configs',
        config[len('mmdet::'):])


def shrunk_zoo_config(case: ZooCase):
    """``case.config`` with its image sizes shrunk to ``IMAGE_SIZE`` on the
    short side and a batch of one, as ``mmddp_ext.doctor.shrink`` does it
    (the doctor's ``--shrink``)."""
    from mmengine.config import Config

    from mmddp_ext.doctor.shrink import shrink_config
    cfg = Config.fromfile(zoo_config_path(case.config),
                          import_custom_modules=False)
    shrink_config(cfg, short_side=IMAGE_SIZE, max_batch=1)
    return cfg


def zoo_model(case: ZooCase) -> Dict:
    """``case.model``, plus the model's data preprocessor where shrinking
    changed it (the batch augments' sizes: YOLOX's random resize range)."""
    from mmengine.config import Config
    zoo = Config.fromfile(zoo_config_path(case.config),
                          import_custom_modules=False).model
    shrunk = shrunk_zoo_config(case).model.get('data_preprocessor')
    if shrunk == zoo.get('data_preprocessor'):
        return dict(case.model)
    return dict(case.model, data_preprocessor=shrunk.to_dict())


def zoo_train_dataloader(case: ZooCase, data_root: str) -> Dict:
    """``case.config``'s own ``train_dataloader`` (pipelines, dataset
    wrappers and batch sampler kept) on the synthetic data: shrunk by
    :func:`shrunk_zoo_config`, unshuffled, no workers, images without
    boxes kept."""
    loader = shrunk_zoo_config(case).train_dataloader.to_dict()
    dataset = loader['dataset']
    while 'dataset' in dataset:  # MultiImageMixDataset and the like
        dataset = dataset['dataset']
    dataset.update(
        type='CocoDataset',
        data_root=data_root,
        ann_file='annotations.json',
        data_prefix=dict(img='images/'),
        metainfo=dict(classes=CLASSES),
        filter_cfg=dict(filter_empty_gt=False, min_size=1),
        backend_args=None)
    loader.update(
        batch_size=1,
        sampler=dict(type='DefaultSampler', shuffle=False),
        _delete_=True)
    return loader


def leaf_config(case: ZooCase, data_root: str, extra: Dict = ()) -> str:
    """Text of a config that adds the recipe to ``case.config`` and shrinks
    it: the synthetic data through the config's own training pipeline
    (:func:`zoo_train_dataloader`; no validation), one epoch of ``ITERS``
    iterations logged every iteration, no checkpoint, and
    :func:`zoo_model`. ``extra`` adds top-level keys."""
    keys = dict(
        model=zoo_model(case),
        train_dataloader=zoo_train_dataloader(case, data_root),
        train_cfg=dict(max_epochs=1),
        val_dataloader=None,
        val_cfg=None,
        val_evaluator=None,
        test_dataloader=None,
        test_cfg=None,
        test_evaluator=None,
        default_hooks=dict(logger=dict(interval=1), checkpoint=None),
        randomness=dict(seed=0),
    )
    keys.update(extra)
    lines = [f'_base_ = {[case.config, RECIPE]!r}']
    lines += [f'{key} = {value!r}' for key, value in keys.items()]
    return '\n'.join(lines) + '\n'
