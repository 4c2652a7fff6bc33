"""``FlatCosineLR`` gives every parameter group the lr that upstream
DEIM's own scheduler code gives it, iteration by iteration.

The expected values are the ``lr_trace`` of each DEIM config in
``data/upstream_recipes.json``: upstream's ``FlatCosineLRScheduler`` and
``LinearWarmup``, built from the YAML by upstream's ``YAMLConfig`` and
driven the way its ``det_engine.py`` drives them, 50 iterations per
epoch. The scheduler here is built from the same YAML values with
MMEngine's epoch-to-iteration conversion.
"""
import math

import pytest
import torch
from mmdet.engine.schedulers import QuadraticWarmupLR
from mmengine.optim.scheduler import CosineAnnealingLR
from mmengine.registry import PARAM_SCHEDULERS

from . import upstream_recipes as upstream
from .deim_utils import import_deim

DEIM_CONFIGS = sorted(upstream.configs(upstream.DEIM))


def flat_cosine_cfg(yaml: dict) -> dict:
    """The scheduler config of an upstream DEIM YAML's values."""
    return dict(
        type='FlatCosineLR',
        warmup_iter=yaml['warmup_iter'],
        flat_epoch=yaml['flat_epoch'],
        no_aug_epoch=yaml['no_aug_epoch'],
        lr_gamma=yaml['lr_gamma'],
        start_factor=1 / yaml['lr_warmup_scheduler']['warmup_duration'],
        begin=0,
        end=yaml['epochs'],
        by_epoch=True,
        convert_to_iter_based=True)


def optimizer_like(record: dict) -> torch.optim.Optimizer:
    """An AdamW whose groups have the upstream groups' lrs."""
    groups = [
        dict(params=[torch.nn.Parameter(torch.zeros(1))], lr=group['lr'])
        for group in record['param_groups']
    ]
    return torch.optim.AdamW(groups)


def trace(scheduler_cfgs, record: dict):
    """The lrs the groups train with at the trace's iterations."""
    optimizer = optimizer_like(record)
    per_epoch = record['lr_trace']['iters_per_epoch']
    schedulers = [
        PARAM_SCHEDULERS.build(
            cfg,
            default_args=dict(optimizer=optimizer, epoch_length=per_epoch))
        for cfg in scheduler_cfgs
    ]
    points = set(record['lr_trace']['iters'])
    total = per_epoch * record['yaml']['epochs']
    lrs = []
    for step in range(total):
        if step in points:
            lrs.append([g['lr'] for g in optimizer.param_groups])
        optimizer.step()
        for scheduler in schedulers:
            scheduler.step()
    return lrs


def assert_same(lrs, expected) -> None:
    assert len(lrs) == len(expected)
    for got, want in zip(lrs, expected):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-15)


@pytest.mark.parametrize('yml', DEIM_CONFIGS)
def test_flat_cosine_equals_upstream_trace(yml):
    import_deim()
    record = upstream.recipe(upstream.DEIM, yml)
    assert record['yaml']['lrsheduler'] == 'flatcosine'
    assert_same(
        trace([flat_cosine_cfg(record['yaml'])], record),
        record['lr_trace']['lrs'])


def test_trace_covers_every_phase():
    """The recorded points reach into each part of the schedule, so the
    comparison above checks them all: warm-up, flat, cosine and the final
    constant (DEIM-D-FINE-S: 132 epochs, flat until 64, last 12 at
    ``lr_gamma``)."""
    record = upstream.recipe(upstream.DEIM,
                             'configs/deim_dfine/deim_hgnetv2_s_coco.yml')
    yaml, lr_trace = record['yaml'], record['lr_trace']
    base = record['param_groups'][-1]['lr']
    last = [lrs[-1] / base for lrs in lr_trace['lrs']]
    assert 0.0 in last and any(0 < x < 0.01 for x in last)  # warm-up
    assert last.count(1.0) > 3  # flat
    assert yaml['lr_gamma'] in [round(x, 12) for x in last]
    assert any(yaml['lr_gamma'] < x < 1 for x in last)  # cosine


def test_mmengine_schedulers_do_not_give_upstream_values():
    """Negative control: MMEngine's own quadratic warm-up and cosine
    (what a user would write for "flat-cosine") miss upstream's values: the
    lr that upstream sets after an iteration is the one the next
    iteration trains with, and its first iteration trains with the
    LinearWarmup's ``1 / warmup_duration``."""
    import_deim()
    record = upstream.recipe(upstream.DEIM,
                             'configs/deim_dfine/deim_hgnetv2_s_coco.yml')
    yaml = record['yaml']
    per_epoch = record['lr_trace']['iters_per_epoch']
    flat = yaml['flat_epoch'] * per_epoch
    total = yaml['epochs'] * per_epoch
    no_aug = yaml['no_aug_epoch'] * per_epoch
    mmengine_cfgs = [
        dict(
            type=QuadraticWarmupLR,
            by_epoch=False,
            begin=0,
            end=yaml['warmup_iter']),
        dict(
            type=CosineAnnealingLR,
            by_epoch=False,
            begin=flat,
            end=total - no_aug,
            eta_min_ratio=yaml['lr_gamma']),
    ]
    got = trace(mmengine_cfgs, record)
    mismatches = [
        i for i, (g, w) in enumerate(zip(got, record['lr_trace']['lrs']))
        if not math.isclose(g[0], w[0], rel_tol=1e-9)
    ]
    assert mismatches
    assert 0 in mismatches  # the first iteration


def test_flat_cosine_checks_its_config():
    import_deim()
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.)
    with pytest.raises(ValueError, match='convert_to_iter_based'):
        PARAM_SCHEDULERS.build(
            dict(
                type='FlatCosineLR',
                warmup_iter=10,
                flat_epoch=2,
                no_aug_epoch=1,
                end=5),
            default_args=dict(optimizer=optimizer))
    with pytest.raises(ValueError, match='needs end'):
        PARAM_SCHEDULERS.build(
            dict(
                type='FlatCosineLR',
                warmup_iter=10,
                flat_epoch=2,
                no_aug_epoch=1,
                by_epoch=False),
            default_args=dict(optimizer=optimizer))
