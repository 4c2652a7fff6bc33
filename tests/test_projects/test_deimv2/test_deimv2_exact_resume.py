"""Exact resume on DEIMv2's recipe (the real Atto model at toy scale):
stopped by SIGUSR1 in the second epoch, where the epoch policy drops
Mosaic, Copy-Blend replaces MixUp and the matcher changes, and resumed,
the run ends with the uninterrupted run's weights and EMA bit for bit.
The dataset draws the augmentation (zoom-out, IoU crop, photometric
distortion, flip; Mosaic in epoch 0); MixUp, Copy-Blend and the
multi-scale batches are drawn in the training step. (Workers, persistent
or not, are the toy's subject: test_exact_resume.py.)

The controls, MMEngine's resume and each part of exact resume removed,
run on the toy of tests/test_runner/exact_resume (a DEIMv2 control run
measured 33 s: the three runs of MMEngine's resume, whose weights differ).
"""
import os.path as osp

import pytest
import torch
from mmengine.config import Config

from mmddp_ext.testing import make_synthetic_coco
from ...test_runner.exact_resume.toy import \
    SignalAtIterationHook  # noqa: F401 (registers the hook)
from .deimv2_utils import PROJECT

CONFIG = osp.join(PROJECT, 'configs', 'deimv2_hgnetv2_atto_tiny_synthetic.py')
IMAGES = 4  # batch 2: 2 iterations per epoch
STOP = 2  # the signal before iteration 2 (epoch 1's first): after 3


@pytest.fixture(scope='module')
def data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('deimv2_resume_data'))
    make_synthetic_coco(osp.join(root, 'train'), num_images=IMAGES, empty=0.3)
    make_synthetic_coco(osp.join(root, 'val'), num_images=2, seed=1)
    return root


def _cfg(data, work_dir, exact=True, signal_at=None, resume=False):
    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = str(work_dir)
    cfg.train_dataloader.dataset.dataset.data_root = f'{data}/'
    cfg.val_dataloader.dataset.data_root = f'{data}/'
    cfg.test_dataloader.dataset.data_root = f'{data}/'
    cfg.val_evaluator.ann_file = f'{data}/val/annotations.json'
    cfg.test_evaluator.ann_file = f'{data}/val/annotations.json'
    cfg.train_cfg.val_interval = cfg.train_cfg.max_epochs + 1
    cfg.randomness = dict(seed=7)
    cfg.mmddp_ext_cfg = dict(
        cfg.get('mmddp_ext_cfg', {}), cpu_amp=False, exact_resume=exact)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    if signal_at is not None:
        cfg.custom_hooks = list(cfg.custom_hooks) + [
            dict(type='SignalAtIterationHook', iteration=signal_at)
        ]
    if resume:
        cfg.resume = 'auto'
    return cfg


def _train(cfg):
    from mmddp_ext.runner import ExtRunner
    ExtRunner.from_cfg(cfg).train()


def _final(work_dir):
    path = osp.join(work_dir, 'epoch_2.pth')
    checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    return checkpoint['state_dict'], checkpoint['ema_state_dict']


def _differs(work_dir, reference) -> list:
    weights, ema = _final(work_dir)
    expected_weights, expected_ema = _final(reference)
    return [
        k for k in expected_weights
        if not torch.equal(weights[k], expected_weights[k])
    ] + [
        f'ema {k}'
        for k in expected_ema if not torch.equal(ema[k], expected_ema[k])
    ]


def test_resumed_deimv2_recipe_equals_uninterrupted(data, tmp_path):
    exact = True
    uninterrupted = str(tmp_path / 'uninterrupted')
    _train(_cfg(data, uninterrupted, exact))
    work_dir = tmp_path / 'run'
    with pytest.raises(SystemExit):
        _train(_cfg(data, work_dir, exact, signal_at=STOP))
    with open(work_dir / 'last_checkpoint') as f:
        assert f.read().strip().endswith(f'iter_{STOP + 1}.pth')
    _train(_cfg(data, work_dir, exact, resume=True))
    assert _differs(str(work_dir), uninterrupted) == []
