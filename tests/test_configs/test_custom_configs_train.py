"""The custom-data configs train on the synthetic set with their EDIT
placeholders filled through --cfg-options (issue 13)."""
import os.path as osp
import re
import sys
from typing import Any, Dict, List

import pytest
from mmengine.config import Config

from mmddp_ext.testing import make_synthetic_coco

from ..helpers import REPO_ROOT, dist_train
from .config_files import custom_config_files, leaf_datasets

CLASSES = ('square', 'disc')
IMAGE_SIZE = 96
CO_DINO_CUSTOM = 'configs/co_dino_ext_custom.py'
NUM_QUERIES = 30
# CO-DINO at CPU size: every branch kept (ATSS, RPN + RoI, encoder
# checkpointing), ResNet-18 from scratch, fewer layers and queries.
CO_DINO_SHRINK = {
    'model.backbone.init_cfg': None,
    'model.backbone.depth': 18,
    'model.neck.in_channels': [64, 128, 256, 512],
    'model.query_head.transformer.encoder.num_layers': 1,
    'model.query_head.transformer.encoder.with_cp': 1,
    'model.query_head.transformer.decoder.num_layers': 2,
    'model.query_head.dn_cfg.group_cfg.num_dn_queries': 10,
    'model.roi_head.0.bbox_head.fc_out_channels': 256,
}


@pytest.fixture(scope='module')
def custom_root(tmp_path_factory):
    """4 train images, the odd ones empty: with an unshuffled sampler on 2
    ranks, rank 1 sees only empty images."""
    root = str(tmp_path_factory.mktemp('custom'))
    make_synthetic_coco(
        osp.join(root, 'train'), num_images=4, classes=CLASSES, empty='odd')
    make_synthetic_coco(
        osp.join(root, 'val'), num_images=2, classes=CLASSES, seed=1)
    return root


def _scale_options(node: Any, key: str) -> Dict[str, Any]:
    """Options that set every resize scale, crop size and fixed pad size
    (LSJ's Pad and BatchFixedSizePad) under ``node`` to IMAGE_SIZE, with
    list indices spelled as --cfg-options expects."""
    options = {}
    is_sequence = isinstance(node, (list, tuple))
    if is_sequence and not all(isinstance(v, (int, float)) for v in node):
        for index, child in enumerate(node):
            options.update(_scale_options(child, f'{key}.{index}'))
    elif isinstance(node, dict):
        size = (IMAGE_SIZE, IMAGE_SIZE)
        for name, value in node.items():
            if name in ('scale', 'crop_size', 'size') and value is not None:
                options[f'{key}.{name}'] = size
            elif name == 'scales':
                options[f'{key}.{name}'] = [size]
            else:
                options.update(_scale_options(value, f'{key}.{name}'))
    return options


def _query_options(node: Any, key: str) -> Dict[str, Any]:
    """Options that set every query count in the model to NUM_QUERIES
    (a 96-pixel image has fewer encoder tokens than 300 queries)."""
    options = {}
    if isinstance(node, (list, tuple)):
        for index, child in enumerate(node):
            options.update(_query_options(child, f'{key}.{index}'))
    elif isinstance(node, dict):
        for name, value in node.items():
            if name in ('num_queries', 'num_query'):
                options[f'{key}.{name}'] = NUM_QUERIES
            else:
                options.update(_query_options(value, f'{key}.{name}'))
    return options


def placeholder_options(cfg: Config, root: str,
                        batch_size: int) -> Dict[str, Any]:
    """The EDIT placeholders (data, classes, load_from) filled for the
    synthetic set, plus one short epoch at IMAGE_SIZE pixels with
    NUM_QUERIES queries."""
    options = {'load_from': None}
    if cfg.model.get('backbone', {}).get('init_cfg'):
        # ImageNet weights (torchvision://, URLs) are not reachable here;
        # the custom configs' load_from replaces them anyway.
        options['model.backbone.init_cfg'] = None
    for split in ('train', 'val', 'test'):
        sub = 'train' if split == 'train' else 'val'
        prefix = f'{split}_dataloader.dataset'
        for key, dataset in leaf_datasets(cfg[f'{split}_dataloader'].dataset,
                                          prefix):
            options.update({
                f'{key}.data_root': f'{root}/',
                f'{key}.ann_file': f'{sub}/annotations.json',
                f'{key}.data_prefix.img': f'{sub}/images/',
                f'{key}.metainfo.classes': CLASSES,
            })
            options.update(
                _scale_options(dataset.get('pipeline'), f'{key}.pipeline'))
        if split != 'train':
            options[f'{split}_evaluator.ann_file'] = (
                f'{root}/val/annotations.json')
    options.update(_query_options(cfg.model, 'model'))
    options.update(
        _scale_options(
            cfg.model.get('data_preprocessor'), 'model.data_preprocessor'))
    options.update({
        'train_dataloader.batch_size': batch_size,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_dataloader.sampler.shuffle': False,
        'train_cfg.max_epochs': 1,
        'train_cfg.val_begin': 2,  # no validation
        'default_hooks.checkpoint': None,
        'default_hooks.logger.interval': 1,
    })
    return options


def as_cli(options: Dict[str, Any]) -> List[str]:
    """``key=value`` strings that MMEngine's DictAction parses back."""

    def spell(value):
        if isinstance(value, (list, tuple)):
            inner = ','.join(spell(v) for v in value)
            return f'[{inner}]' if isinstance(value, list) else f'({inner})'
        return str(value)

    return [f'{key}={spell(value)}' for key, value in options.items()]


# Sizes whose one step is left out (the suite's time budget): within a
# family the sizes share data pipeline, detector, head and losses, and
# differ in widths and depths, which every size's upstream checkpoint (or
# key manifest written by upstream's code) pins shape for shape, loaded
# strictly (test_convert_dfine_checkpoint, test_deim_configs,
# test_rtdetr_zoo, test_convert_deimv2_checkpoint); test_build_every_config
# builds every config. Each family keeps its smallest size here (since
# 2026-11-28; the S and M sizes' steps took 16 s of the suite, and the 2-rank
# runs of test_dfine_dist, test_deim_dist and test_rtdetr_dist train the
# smallest sizes' code too) (and
# DEIMv2 the smallest of its HGNetv2 family: its DINOv3 family's smallest
# custom config, deimv2_dinov3_s_custom.py, trains on 2 ranks, one of them
# GT-less, in test_ddp_doctor_dfine_deim.py; tests/test_projects/
# test_deimv2 trains both on a GT-less batch).
# CO-DINO's Swin-L custom config differs from the R50 LSJ one in its
# backbone only (mmdet's SwinTransformer, 28 s of the suite to build and
# step), whose keys test_state_dict_keys pins against upstream's.
LEFT_OUT_SIZES = ('co_dino_5scale_swin_l_custom.py',
                  'dfine_hgnetv2_s_custom.py', 'dfine_hgnetv2_m_custom.py',
                  'dfine_hgnetv2_l_custom.py', 'dfine_hgnetv2_x_custom.py',
                  'deim_hgnetv2_s_custom.py', 'deim_hgnetv2_m_custom.py',
                  'deim_hgnetv2_l_custom.py', 'deim_hgnetv2_x_custom.py',
                  'deim_rtdetrv2_r34vd_custom.py',
                  'deim_rtdetrv2_r50vd_m_custom.py',
                  'deim_rtdetrv2_r50vd_custom.py',
                  'deim_rtdetrv2_r101vd_custom.py', 'rtdetr_r34vd_custom.py',
                  'rtdetr_r50vd_m_custom.py', 'rtdetr_r50vd_custom.py',
                  'rtdetr_r101vd_custom.py')
DEIMV2_HERE = ('deimv2_hgnetv2_atto_custom.py', )
ONE_STEP_CONFIGS = [
    c for c in custom_config_files()
    if c != CO_DINO_CUSTOM and osp.basename(c) not in LEFT_OUT_SIZES and (
        '/DEIMv2/' not in c or osp.basename(c) in DEIMV2_HERE)
]


@pytest.mark.parametrize('config', ONE_STEP_CONFIGS)
def test_custom_config_trains_one_step(custom_root, tmp_path, config):
    """One step of the config as a user fills it, in float32 on CPU ranks
    (``mmddp_ext_cfg.cpu_amp=False``): the subject is each config's data
    and model plumbing; float16 convolutions run about 20 times slower than
    float32 ones on this CPU, and the AMP recipes' float16 path is
    tests/test_amp's subject (every family on 2 ranks)."""
    import mmddp_ext  # noqa: F401
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(osp.join(REPO_ROOT, config))
    options = placeholder_options(cfg, custom_root, batch_size=1)
    # One step on one image (the first, which has boxes): the time budget.
    for key, _ in leaf_datasets(cfg.train_dataloader.dataset,
                                'train_dataloader.dataset'):
        options[f'{key}.indices'] = 1
    depths = cfg.model.get('backbone', {}).get('depths')
    if depths:  # Swin-L's 24 blocks, 2 per stage at most
        options['model.backbone.depths'] = [min(d, 2) for d in depths]
    options['mmddp_ext_cfg.cpu_amp'] = False
    cfg.merge_from_dict(options)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.launcher = 'none'
    runner = RUNNERS.build(cfg)
    runner.train()
    assert runner.iter == 1
    assert runner.message_hub.get_scalar('train/loss').current() > 0


def test_co_dino_ext_custom_trains_on_two_ranks(custom_root, tmp_path):
    """Acceptance: 2 iterations on 2 CPU ranks through tools/dist_train.sh;
    rank 1 sees only empty images."""
    cfg = Config.fromfile(osp.join(REPO_ROOT, CO_DINO_CUSTOM))
    options = placeholder_options(cfg, custom_root, batch_size=1)
    options.update(CO_DINO_SHRINK)
    work_dir = str(tmp_path / 'work')
    result = dist_train(
        osp.join(REPO_ROOT, CO_DINO_CUSTOM),
        2,
        work_dir,
        as_cli(options),
        timeout=200,
        env={'PYTHON': sys.executable})
    out = result.stdout
    steps = re.findall(r'Epoch\(train\)\s+\[1\]\[(\d)/2\].*loss: ', out)
    assert steps == ['1', '2'], out[-3000:]
    assert 'gloo process group, rank 0/2' in out
    assert 'rank 1: 2/2 samples without GT, 2 all-empty batches' in out
