"""Upstream's CO-DINO R50 LSJ config, as upstream writes it (its type names
``DetrTransformerEncoder`` / ``DinoTransformerDecoder`` /
``DetrTransformerDecoderLayer``, LSJ + CopyPaste pipeline, use_lsj=True),
trains on the port through ``tools/dist_train.sh`` on 2 gloo ranks after
shrinking by ``--cfg-options`` only; rank 1 only ever sees GT-less images.
Without the upstream type names the same config does not even build, with
the error users reported."""
import json
import os.path as osp
import re

import pytest

from mmddp_ext.testing import make_synthetic_coco
from ...helpers import REPO_ROOT, as_cli, dist_train, logged_iters

LSJ_CONFIG = osp.join(REPO_ROOT, 'projects', 'CO-DETR', 'configs', 'codino',
                      'co_dino_5scale_r50_lsj_8xb2_1x_coco.py')
NPROC, BATCH, ITERS = 2, 2, 2
SIZE = (96, 96)
COCO_NAMES = ('person', 'bicycle')
# load_pipeline: 0 load image, 1 annotations, 2 RandomResize, 3 RandomCrop,
# 4 FilterAnnotations, 5 RandomFlip, 6 Pad.
LOAD = 'train_dataloader.dataset.dataset.pipeline'
LAYERS = 'model.query_head.transformer'


def _with_box_masks(ann_file: str) -> None:
    """Give every box a rectangle polygon: upstream's LSJ pipeline loads
    instance masks (for CopyPaste)."""
    with open(ann_file) as f:
        coco = json.load(f)
    for ann in coco['annotations']:
        x, y, w, h = ann['bbox']
        ann['segmentation'] = [[x, y, x + w, y, x + w, y + h, x, y + h]]
    with open(ann_file, 'w') as f:
        json.dump(coco, f)


def _shrink(root: str) -> dict:
    """Image size, depth and width, data location and run length."""
    train = f'{root}/train/'
    return {
        # image size: 1024 -> 96
        'model.data_preprocessor.batch_augments.0.size': SIZE,
        f'{LOAD}.2.scale': SIZE,
        f'{LOAD}.3.crop_size': SIZE,
        f'{LOAD}.6.size': SIZE,
        # depth: ResNet-18, one encoder and two decoder layers, 30 queries
        'model.backbone.depth': 18,
        'model.backbone.init_cfg': None,
        'model.neck.in_channels': [64, 128, 256, 512],
        'model.query_head.num_query': 30,
        'model.query_head.transformer.encoder.num_layers': 1,
        'model.query_head.transformer.encoder.with_cp': 1,
        'model.query_head.transformer.decoder.num_layers': 2,
        # width: FFNs and RoI fcs
        f'{LAYERS}.encoder.transformerlayers.feedforward_channels': 256,
        f'{LAYERS}.decoder.transformerlayers.feedforward_channels': 256,
        'model.roi_head.0.bbox_head.fc_out_channels': 256,
        # per-image query, proposal and RoI counts, scaled with image area
        'model.query_head.max_pos_coords': 30,
        'model.query_head.dn_cfg.group_cfg.num_dn_queries': 20,
        'model.train_cfg.1.rpn_proposal.nms_pre': 400,
        'model.train_cfg.1.rpn_proposal.max_per_img': 100,
        'model.train_cfg.1.rcnn.sampler.num': 64,
        # data
        'train_dataloader.dataset.dataset.data_root': train,
        'train_dataloader.dataset.dataset.ann_file': 'annotations.json',
        'train_dataloader.dataset.dataset.data_prefix.img': 'images/',
        'train_dataloader.sampler.shuffle': False,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        # Rank 1 keeps only its GT-less images: no objects pasted in.
        'train_dataloader.dataset.pipeline.0.max_num_pasted': 1,
        # no evaluation (mmengine validates after the last epoch otherwise)
        **{
            f'{split}_{part}': None
            for split in ('val', 'test')
            for part in ('cfg', 'dataloader', 'evaluator')
        },
        # run length: one epoch of 2 iterations, no evaluation/checkpoint
        'train_cfg.max_epochs': 1,
        'default_hooks.checkpoint.interval': 2,
        'default_hooks.checkpoint.save_last': False,
        'default_hooks.logger.interval': 1,
        'log_processor.by_epoch': False,
        'randomness.seed': 0,
    }


def test_upstream_lsj_config_trains_on_two_ranks_one_without_gt(tmp_path):
    root = str(tmp_path / 'data')
    # Unshuffled, rank r reads images r, r + 2, ...: rank 1 only odd ones.
    # COCO class names: the config keeps COCO's 80 classes.
    make_synthetic_coco(
        osp.join(root, 'train'), num_images=NPROC * BATCH * ITERS,
        classes=COCO_NAMES, empty='odd')
    _with_box_masks(osp.join(root, 'train', 'annotations.json'))
    work_dir = str(tmp_path / 'work')
    result = dist_train(
        LSJ_CONFIG, NPROC, work_dir, as_cli(_shrink(root)), timeout=200)
    out = result.stdout
    assert f'gloo process group, rank 0/{NPROC}' in out
    assert logged_iters(out) == list(range(1, ITERS + 1)), out[-3000:]
    # Every rank trained both iterations: rank 1 on GT-less images only.
    empty_on_rank0 = re.search(r'rank 0: (\d+)/(\d+) samples without GT',
                               out)
    assert empty_on_rank0, out[-3000:]
    assert int(empty_on_rank0[1]) < int(empty_on_rank0[2]) == BATCH * ITERS
    assert (f'rank 1: {BATCH * ITERS}/{BATCH * ITERS} samples without GT, '
            f'{ITERS} all-empty batches') in out
    assert 'AutoDDP:' in out
    assert 'non-reentrant in 1 module(s): query_head.transformer.encoder' \
        in out or 'CheckpointConflictHook: checked 1 checkpointing module' \
        in out, out[-3000:]


def test_upstream_type_names_are_what_makes_the_config_build(monkeypatch):
    """The mechanism: the port registers upstream's type names. Without
    them the config fails as users saw it fail."""
    from mmdet.registry import MODELS
    from mmengine.config import Config

    from .codetr_utils import import_project
    from mmddp_ext.testing import weights_on_meta
    codetr = import_project()
    cfg = Config.fromfile(LSJ_CONFIG).model.query_head.transformer
    cfg.encoder.num_layers = cfg.decoder.num_layers = cfg.encoder.with_cp = 1
    encoder = MODELS.build(cfg.encoder)
    assert type(encoder) is codetr.CoDetrTransformerEncoder
    assert encoder.with_cp == 1
    layer = MODELS.build(cfg.decoder).layers[0]
    assert isinstance(layer, codetr.DetrTransformerDecoderLayer)
    assert type(MODELS.build(cfg.decoder)) is codetr.CoDinoTransformerDecoder

    monkeypatch.delitem(MODELS._module_dict, 'DetrTransformerEncoder')
    with pytest.raises(KeyError, match='DetrTransformerEncoder is not in '
                       'the mmdet::model registry'):
        with weights_on_meta():
            MODELS.build(cfg)
