"""Upstream's CO-DINO R50 LSJ config, as upstream writes it (its type names
``DetrTransformerEncoder`` / ``DinoTransformerDecoder`` /
``DetrTransformerDecoderLayer``, LSJ + CopyPaste pipeline, use_lsj=True),
trains on the port on 2 gloo ranks (``tools/train.py`` as
``tools/dist_train.sh`` starts it, on ranks forked with their imports done:
``tests/helpers.py::train_on_ranks``) after
shrinking by ``--cfg-options`` only, with ``--auto-scale-lr``; rank 1's own
images have no boxes, and CopyPaste (upstream's ``max_num_pasted=100``)
pastes objects of other images into some of them. Without the upstream
type names the same config does not even build, with the error users
reported."""
import json
import os.path as osp
import re

import pytest

from mmddp_ext.testing import make_synthetic_coco
from ...helpers import REPO_ROOT, as_cli, logged_iters, train_on_ranks
from ...test_model_zoo.test_model_zoo_matrix import rank_logs

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
        # one log file per rank (read by the test)
        'log_level': 'DEBUG',
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
        'randomness.seed': 2,
    }


def test_upstream_lsj_config_trains_on_two_ranks_one_without_gt(tmp_path):
    root = str(tmp_path / 'data')
    # Unshuffled, rank r reads images r, r + 2, ...: rank 1 only odd ones.
    # COCO class names: the config keeps COCO's 80 classes.
    make_synthetic_coco(
        osp.join(root, 'train'),
        num_images=NPROC * BATCH * ITERS,
        classes=COCO_NAMES,
        empty='odd')
    _with_box_masks(osp.join(root, 'train', 'annotations.json'))
    work_dir = str(tmp_path / 'work')
    result = train_on_ranks(
        LSJ_CONFIG,
        NPROC,
        work_dir,
        as_cli(_shrink(root)),
        timeout=200,
        extra_args=('--auto-scale-lr', ))
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    assert f'gloo process group, rank 0/{NPROC}' in out
    assert logged_iters(out) == list(range(1, ITERS + 1)), out[-3000:]
    logs = rank_logs(work_dir)
    assert sorted(logs) == list(range(NPROC)), out[-3000:]
    samples = BATCH * ITERS
    for rank, log in logs.items():
        # --auto-scale-lr: lr x (2 ranks x 2 images) / 16, on every rank.
        # MMEngine logs the first parameter group's lr: the backbone's,
        # 2e-4 x 0.1 (custom_keys lr_mult).
        assert ('Scaling the original LR by '
                f'{NPROC * BATCH / 16}') in log, (rank, log[-3000:])
        lrs = {float(v) for v in re.findall(r' lr: (\S+)', log)}
        assert lrs == {2e-5 * NPROC * BATCH / 16}, (rank, lrs)
        # EmptyGTStatsHook's counts, as each rank logged them
        counts = re.search(
            rf'rank {rank}: (\d+)/{samples} samples without '
            'GT', log)
        assert counts, (rank, log[-3000:])
    # Rank 1's images have no boxes of their own: the boxes it trained on
    # were pasted in by CopyPaste, into some of its images, and the rest
    # stayed GT-less (with seed 2 and exact resume's per-sample seeds;
    # seed 1 pastes nothing into rank 1's four images). Rank 0 also met
    # boxes.
    without_gt = {
        rank: int(re.search(rf'rank {rank}: (\d+)/', log)[1])
        for rank, log in logs.items()
    }
    assert without_gt[0] < samples
    assert 0 < without_gt[1] < samples, without_gt
    assert 'AutoDDP:' in out
    assert 'non-reentrant in 1 module(s): query_head.transformer.encoder' \
        in out or 'CheckpointConflictHook: checked 1 checkpointing module' \
        in out, out[-3000:]


def test_upstream_type_names_are_what_makes_the_config_build(monkeypatch):
    """The mechanism: the port registers upstream's type names. Without
    them the config fails as users saw it fail."""
    from mmdet.registry import MODELS
    from mmengine.config import Config

    from mmddp_ext.testing import weights_on_meta
    from .codetr_utils import import_project
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
    with pytest.raises(
            KeyError,
            match='DetrTransformerEncoder is not in '
            'the mmdet::model registry'):
        with weights_on_meta():
            MODELS.build(cfg)


def test_copy_paste_with_gt_less_images(tmp_path):
    """The config's own LSJ load pipeline and CopyPaste (max_num_pasted
    100), in one process: a GT-less image receives the pasted objects of
    an image with boxes; an image with boxes keeps its own under a GT-less
    source; two GT-less images stay GT-less."""
    import copy
    import random

    import numpy as np
    from mmdet.registry import DATASETS, TRANSFORMS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    from .codetr_utils import import_project
    import_project()
    init_default_scope('mmdet')
    root = str(tmp_path / 'data')
    make_synthetic_coco(
        osp.join(root, 'train'), num_images=4, classes=COCO_NAMES, empty='odd')
    _with_box_masks(osp.join(root, 'train', 'annotations.json'))
    cfg = Config.fromfile(LSJ_CONFIG)
    cfg.merge_from_dict(_shrink(root))
    load = DATASETS.build(cfg.train_dataloader.dataset.dataset)
    copy_paste = TRANSFORMS.build(cfg.train_dataloader.dataset.pipeline[0])
    assert copy_paste.max_num_pasted == 100

    def paste(dst: int, src: int, seed: int):
        random.seed(seed)
        np.random.seed(seed)
        results = copy.deepcopy(load[dst])
        source = copy.deepcopy(load[src])
        counts = len(results['gt_bboxes']), len(source['gt_bboxes'])
        results['mix_results'] = [source]
        image = results['img'].copy()
        out = copy_paste(results)
        return counts, out, image

    pasted = []
    for seed in range(20):
        (own, offered), out, image = paste(dst=1, src=0, seed=seed)
        assert own == 0  # image 1 has no boxes
        got = len(out['gt_bboxes'])
        assert got <= offered and len(out['gt_masks']) == got
        if got:
            assert not np.array_equal(out['img'], image)  # objects pasted
            pasted.append(got)
        (own, offered), out, _ = paste(dst=0, src=1, seed=seed)
        assert offered == 0 and len(out['gt_bboxes']) == own
        (own, offered), out, _ = paste(dst=1, src=3, seed=seed)
        assert own == offered == len(out['gt_bboxes']) == 0
    assert pasted, 'CopyPaste never pasted into the GT-less image'
