"""DEIM-D-FINE-N (tiny) on 2 real gloo ranks, ``tools/train.py`` as
``tools/dist_train.sh`` starts it, ``find_unused_parameters=False``, 20
iterations (2 epochs of 10), with DEIM's recipe running (policy, Mosaic,
MixUp, multi-scale, flat-cosine, EMA), on images without boxes; then a
restart. Upstream DEIM's empty-batch behaviour as the negative control.

Runs of ``projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py`` on
generated data, recorded on every rank by ``GradientRecordHook``
(``test_dfine/ddp_probe.py``: parameters with a gradient, loss keys,
finiteness, GT count per iteration) and ``ResumeRecordHook``
(``deim_probe.py``: EMA and policy epoch at the start):

- ``empty_rank``: an unshuffled sampler gives rank 1 only images without
  boxes, every iteration (Mosaic off: it would paste in other ranks'
  images; MixUp on, mixing two empty images);
- ``half_empty``: a shuffled set, about half of the images empty, the
  whole tiny policy (Mosaic and MixUp in epoch 0, zoom-out / IoU crop in
  epoch 1), a checkpoint per epoch; ``resumed``: the same run restarted
  from its epoch-1 checkpoint (``tools/train.py --resume``).

Every run is on ranks forked with their imports done
(``tests/helpers.py::train_on_ranks``: the subject is what DDP does with
DEIM's recipe, not the launcher; until 2026-11-29 the first two were
launches of ``tools/dist_train.sh``, which the self-test's CI form still
runs DEIM through, ``tests/test_tools/test_selftest.py``).

The control is not a launch: one DDP step of the tiny model with upstream
DEIM's empty-batch behaviour (no dn queries and no dn loss terms on the
GT-less rank) on 2 ranks started by ``run_on_ranks``
(``control_step_report``, a 10 s collective timeout), rank 1's batch
without boxes; it fails as the launch did (the reducer's error on the
GT-less rank, a collective timeout on the other) in under half the
launch's time. D-FINE's control
(``test_dfine_dist.py::test_upstream_empty_batch_behaviour_hangs``) still
shows the hang through the launcher. ``upstream_control_step`` and
``check_upstream_control_breaks_ddp`` serve the DEIMv2 control too.
"""
import json
import os.path as osp

import pytest
import torch

from mmddp_ext.testing import make_synthetic_coco, run_on_ranks
from ...helpers import train_on_ranks
from ...test_models.dino_utils import (build_model, control_step_report,
                                       raw_batch, record_generator_calls)
from .deim_utils import PROJECT
from .test_deim_head import EXPECTED_KEYS

TINY_CONFIG = osp.join(PROJECT, 'configs', 'deim_hgnetv2_tiny_synthetic.py')
WORLD_SIZE = 2
BATCH = 2
ITERS_PER_EPOCH = 10
EPOCHS = 2
ITERS = ITERS_PER_EPOCH * EPOCHS
EMPTY_RANK = 1
CONTROL_TIMEOUT_S = 10
# the control's batches: rank 0 two images with 2 and 1 boxes, rank 1
# (EMPTY_RANK) two without
CONTROL_GT_COUNTS = [[2, 1], [0, 0]]
PROBES = ('tests.test_projects.test_dfine.ddp_probe',
          'tests.test_projects.test_deim.deim_probe')


def _config(root: str) -> str:
    path = osp.join(root, 'probe_config.py')
    lines = [
        f'_base_ = [{TINY_CONFIG!r}]',
        'custom_imports = dict(imports=["projects.D-FINE.dfine", '
        f'"projects.DEIM.deim", "{PROBES[0]}", "{PROBES[1]}"], '
        'allow_failed_imports=False)',
        'custom_hooks = [dict(type="ModelEMAHook", decay=0.9999, '
        'warmups=1000, priority=49), dict(type="SetEpochHook"), '
        'dict(type="GradientRecordHook"), dict(type="ResumeRecordHook")]',
    ]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def _data(root: str, empty) -> str:
    data = osp.join(root, 'data')
    make_synthetic_coco(
        osp.join(data, 'train'),
        num_images=WORLD_SIZE * BATCH * ITERS_PER_EPOCH,
        empty=empty)
    make_synthetic_coco(osp.join(data, 'val'), num_images=2, seed=1)
    return data


def _options(data: str, shuffle: bool, extra=()) -> list:
    return [
        f'train_dataloader.dataset.dataset.data_root={data}/',
        f'val_dataloader.dataset.data_root={data}/',
        f'test_dataloader.dataset.data_root={data}/',
        f'val_evaluator.ann_file={data}/val/annotations.json',
        f'test_evaluator.ann_file={data}/val/annotations.json',
        f'train_dataloader.sampler.shuffle={shuffle}',
        f'train_cfg.max_epochs={EPOCHS}',
        f'train_cfg.val_interval={EPOCHS + 1}',
        'model_wrapper_cfg.type=MMDistributedDataParallel',
        'model_wrapper_cfg.find_unused_parameters=False',
        # float32 ranks: DDP on empty ranks is the subject here, the AMP
        # recipe's float16 path tests/test_amp's (float16 convolutions run
        # about 20 times slower than float32 ones on CPU)
        'mmddp_ext_cfg.cpu_amp=False',
        *extra,
    ]


def _records(work_dir: str, name: str) -> list:
    found = []
    for rank in range(WORLD_SIZE):
        path = osp.join(work_dir, f'{name}_rank{rank}.json')
        if osp.exists(path):
            with open(path) as f:
                found.append(json.load(f))
    return found


def _run(root, config, options, extra_args=()):
    """A 2-rank run of ``tools/train.py`` as ``tools/dist_train.sh`` starts
    it, on ranks forked with their imports done
    (``tests/helpers.py::train_on_ranks``)."""
    work_dir = osp.join(root, 'work')
    output = train_on_ranks(
        config,
        WORLD_SIZE,
        work_dir,
        options,
        extra_args=extra_args,
        timeout=240)
    assert output.returncode == 0, output.stdout[-4000:]
    return dict(
        output=output,
        work_dir=work_dir,
        grads=_records(work_dir, 'grad_record'),
        resume=_records(work_dir, 'resume_record'))


@pytest.fixture(scope='module')
def empty_rank(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('deim_empty_rank'))
    data = _data(root, 'odd')
    # no Mosaic (policy from epoch 2 on, after the run), MixUp in epoch 0
    options = _options(data, False, [
        'train_dataloader.dataset.policy.epoch=[2,2,2]',
    ])
    return _run(root, _config(root), options)


@pytest.fixture(scope='module')
def half_empty(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('deim_half_empty'))
    data = _data(root, 0.5)
    first = _run(root, _config(root), _options(data, True))
    resumed_root = osp.join(root, 'resumed')
    resumed = _run(
        resumed_root,
        _config(root),
        _options(data, True),
        extra_args=('--resume', osp.join(first['work_dir'], 'epoch_1.pth')))
    return first, resumed


def _check_same_graph_and_keys(run, iters=ITERS):
    """Every rank: every trainable parameter with a gradient in every
    iteration, the same full set of loss keys as its peer, all finite;
    MMEngine logged every iteration."""
    output, records = run['output'], run['grads']
    logged = logged_epoch_iters(output.stdout)
    assert len(logged) == iters, logged
    assert 'find_unused_parameters=False' in output.stdout
    assert len(records) == WORLD_SIZE
    for rank, record in enumerate(records):
        assert len(record['records']) == iters, rank
        assert record['trainable'] == records[0]['trainable']
        for step, peer in zip(record['records'], records[0]['records']):
            assert step['missing_grads'] == [], (rank, step)
            assert set(step['loss_keys']) == EXPECTED_KEYS, (rank, step)
            assert step['loss_keys'] == peer['loss_keys']
            assert step['all_finite'], (rank, step)


def logged_epoch_iters(text: str) -> list:
    import re
    return re.findall(r'Epoch\(train\)\s+\[(\d+)\]\[\s*(\d+)/\d+\].*loss: ',
                      text)


def test_rank_with_only_empty_images(empty_rank):
    _check_same_graph_and_keys(empty_rank)
    gt = [[s['num_gt'] for s in r['records']] for r in empty_rank['grads']]
    assert set(gt[EMPTY_RANK]) == {0}
    assert all(n > 0 for n in gt[1 - EMPTY_RANK])


def test_half_empty_set_with_deims_policy(half_empty):
    first, _ = half_empty
    _check_same_graph_and_keys(first)
    gt = [s['num_gt'] for r in first['grads'] for s in r['records']]
    assert max(gt) > 0
    # the policy and batch augments got each epoch on every rank
    for record in first['resume']:
        assert record['epochs'] == [
            dict(
                epoch=e,
                dataset_epochs=[e],
                stages=[e + 1],
                augment_epochs=[e]) for e in range(EPOCHS)
        ]


def test_restart_keeps_ema_state_and_policy_epoch(half_empty):
    """Resumed from the epoch-1 checkpoint: on every rank the EMA starts
    with the saved average (weights and update count, not a copy of the
    model) and the data policy and batch augments start at epoch 1 (stage
    2: no Mosaic, no MixUp); the 10 remaining iterations train."""
    first, resumed = half_empty
    checkpoint = torch.load(
        osp.join(first['work_dir'], 'epoch_1.pth'),
        map_location='cpu',
        weights_only=False)
    saved_ema = {
        k: float(v.double().sum())
        for k, v in checkpoint['state_dict'].items()
        if v.dtype.is_floating_point
    }
    saved_steps = int(checkpoint['ema_state_dict']['steps'])
    assert saved_steps == ITERS_PER_EPOCH
    assert len(resumed['resume']) == WORLD_SIZE
    for record in resumed['resume']:
        assert record['start_iter'] == ITERS_PER_EPOCH
        assert record['ema_steps'] == saved_steps
        assert record['ema_sum'] == pytest.approx(saved_ema, rel=1e-12)
        assert record['epochs'] == [
            dict(epoch=1, dataset_epochs=[1], stages=[2], augment_epochs=[1])
        ]
    _check_same_graph_and_keys(resumed, iters=ITERS_PER_EPOCH)


def upstream_control_step(model) -> dict:
    """This rank's part of a negative control: one 2-pass DDP step of
    ``model`` (``control_step_report``: ``find_unused_parameters=False``,
    collectives timing out after ``CONTROL_TIMEOUT_S``), rank 0's batch
    with boxes, rank 1's without (``CONTROL_GT_COUNTS``). Returns the
    report with the dn query count of each forward (``dn_queries``)."""
    import torch.distributed as dist
    rank = dist.get_rank()
    calls = record_generator_calls(model.dn_query_generator)
    batch = raw_batch(CONTROL_GT_COUNTS[rank], first_index=BATCH * rank)
    report = control_step_report(model, batch, CONTROL_TIMEOUT_S)
    return dict(report, dn_queries=[c['num_denoising_queries'] for c in calls])


def check_upstream_control_breaks_ddp(results: list,
                                      expected_keys: set) -> None:
    """What ``upstream_control_step`` on 2 ranks gives with upstream's
    empty-batch behaviour: the GT-less rank had no dn queries and its
    loss dict lacks every dn key (shorter than its peer's, which has
    ``expected_keys``); DDP stops that rank at the next step ("Expected to
    have finished reduction") while the rank with boxes waits in the
    gradient all-reduce until the collective timeout. Prints each rank's
    error."""
    with_gt, without = results[1 - EMPTY_RANK], results[EMPTY_RANK]
    for rank, result in enumerate(results):
        print(f'\ncontrol rank {rank}: {(result["error"] or "")[:160]}')
    assert without['dn_queries'][0] == 0
    assert with_gt['dn_queries'][0] > 0
    assert set(with_gt['loss_keys'][0]) == expected_keys
    without_dn = {k for k in expected_keys if '_dn_' not in k}
    assert set(without['loss_keys'][0]) == without_dn
    assert len(without['loss_keys'][0]) < len(with_gt['loss_keys'][0])
    assert 'Expected to have finished reduction' in (without['error'] or '')
    assert f'Timed out waiting {CONTROL_TIMEOUT_S * 1000}ms' in (
        with_gt['error'] or '')


def _control_rank(upstream: bool = True) -> dict:
    """``upstream_control_step`` of the tiny DEIM model (no batch
    augments) with upstream DEIM's empty-batch behaviour: the dn generator
    of ``DFINEUpstreamEmptyDn`` and the criterion of
    ``DEIMUpstreamEmptyDnHead``; ``upstream=False`` keeps the port's own
    (the control's control)."""
    from mmengine.config import Config

    from . import deim_probe  # noqa: F401  (registers the behaviour)
    cfg = Config.fromfile(TINY_CONFIG).model
    cfg.data_preprocessor.batch_augments = None
    if upstream:
        cfg.type = 'DFINEUpstreamEmptyDn'
        cfg.bbox_head.type = 'DEIMUpstreamEmptyDnHead'
    return upstream_control_step(build_model(cfg))


def test_upstream_empty_batch_behaviour_fails():
    """Negative control: with upstream DEIM's empty-batch behaviour the
    GT-less rank has no dn queries, so its loss dict lacks every dn term
    (shorter than its peer's, which has every key) and its dn class
    embedding gets no gradient; DDP (``find_unused_parameters=False``)
    stops that rank at the next step ("Expected to have finished
    reduction") while the rank with boxes never completes its gradient
    all-reduce and waits until the collective timeout (what users saw as
    an NCCL timeout)."""
    results = run_on_ranks(_control_rank, WORLD_SIZE, timeout=120)
    check_upstream_control_breaks_ddp(results, EXPECTED_KEYS)
