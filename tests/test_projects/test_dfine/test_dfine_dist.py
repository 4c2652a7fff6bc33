"""D-FINE-N (tiny) on 2 real gloo ranks, ``find_unused_parameters=False``,
20 iterations, on images without boxes.

Three runs of the tiny config on generated data, each recorded on every
rank by ``ddp_probe.GradientRecordHook`` (the parameters that received a
gradient and the loss keys of each iteration):

- ``empty_rank``: an unshuffled sampler gives rank 1 only images without
  boxes, every iteration;
- ``half_empty``: a shuffled set with about half of the images empty
  (these two: ``tools/train.py`` as ``dist_train.sh`` starts it, on ranks
  forked with their imports done: ``tests/helpers.py::train_on_ranks``;
  the launcher is the control's, and the self-test's CI form's);
- ``upstream_control``: the negative control, the ``empty_rank`` run with
  upstream D-FINE's empty-batch behaviour (no dn queries on the GT-less
  rank, ``ddp_probe.DFINEUpstreamEmptyDn``) and a 20 s collective
  timeout.
"""
import functools
import json
import os.path as osp

import pytest

from mmddp_ext.testing import make_synthetic_coco
from ...helpers import (data_options, dist_train, logged_iters, tiny_options,
                        train_on_ranks)
from .dfine_utils import EXPECTED_KEYS, TINY_CONFIG

ITERS = 20
WORLD_SIZE = 2
EMPTY_RANK = 1
CONTROL_TIMEOUT_S = 20
PROBE = 'tests.test_projects.test_dfine.ddp_probe'


def _probe_config(root: str, model_type: str = None) -> str:
    """The tiny config plus the recording hook (and a model type)."""
    path = osp.join(root, 'probe_config.py')
    lines = [
        f'_base_ = [{TINY_CONFIG!r}]',
        'custom_imports = dict(imports=["projects.D-FINE.dfine", '
        f'"{PROBE}"], allow_failed_imports=False)',
        'custom_hooks = [dict(type="GradientRecordHook")]',
    ]
    if model_type:
        lines.append(f'model = dict(type={model_type!r})')
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def _train(root: str,
           empty,
           shuffle: bool,
           model_type: str = None,
           extra=(),
           check=True,
           launch=True):
    make_synthetic_coco(
        osp.join(root, 'train'),
        num_images=WORLD_SIZE * 2 * ITERS,
        empty=empty)
    make_synthetic_coco(osp.join(root, 'val'), num_images=2, seed=1)
    work_dir = osp.join(root, 'work')
    options = data_options(root) + tiny_options(ITERS) + [
        f'train_dataloader.sampler.shuffle={shuffle}',
        'model_wrapper_cfg.type=MMDistributedDataParallel',
        'model_wrapper_cfg.find_unused_parameters=False',
        # float32 ranks: DDP on empty ranks is the subject here, the AMP
        # recipe's float16 path tests/test_amp's
        'mmddp_ext_cfg.cpu_amp=False', *extra
    ]
    run = functools.partial(dist_train, check=check) if launch else \
        train_on_ranks
    output = run(
        _probe_config(root, model_type),
        WORLD_SIZE,
        work_dir,
        options,
        timeout=240)
    assert output.returncode == 0 or not check, output.stdout[-4000:]
    records = []
    for rank in range(WORLD_SIZE):
        path = osp.join(work_dir, f'grad_record_rank{rank}.json')
        if osp.exists(path):
            with open(path) as f:
                records.append(json.load(f))
    return output, records


@pytest.fixture(scope='module')
def empty_rank(tmp_path_factory):
    return _train(
        str(tmp_path_factory.mktemp('dfine_empty_rank')),
        'odd',
        False,
        launch=False)


@pytest.fixture(scope='module')
def half_empty(tmp_path_factory):
    return _train(
        str(tmp_path_factory.mktemp('dfine_half_empty')),
        0.5,
        True,
        launch=False)


def _check_same_graph_and_keys(run):
    """Every rank: 20 iterations, every trainable parameter with a gradient
    in every iteration, the same full set of loss keys as its peer, all
    finite; MMEngine logged all 20 iterations."""
    output, records = run
    assert logged_iters(output.stdout) == list(range(1, ITERS + 1))
    assert 'find_unused_parameters=False' in output.stdout
    assert len(records) == WORLD_SIZE
    for rank, record in enumerate(records):
        assert len(record['records']) == ITERS, rank
        assert record['trainable'] == records[0]['trainable']
        for step, peer in zip(record['records'], records[0]['records']):
            assert step['missing_grads'] == [], (rank, step)
            assert set(step['loss_keys']) == EXPECTED_KEYS, (rank, step)
            assert step['loss_keys'] == peer['loss_keys']
            assert step['all_finite'], (rank, step)


def test_rank_with_only_empty_images(empty_rank):
    _check_same_graph_and_keys(empty_rank)
    _, records = empty_rank
    gt_per_rank = [[s['num_gt'] for s in r['records']] for r in records]
    assert set(gt_per_rank[EMPTY_RANK]) == {0}
    assert all(n > 0 for n in gt_per_rank[1 - EMPTY_RANK])


def test_half_empty_set(half_empty):
    _check_same_graph_and_keys(half_empty)
    _, records = half_empty
    gt = [s['num_gt'] for r in records for s in r['records']]
    # Both kinds of batch met: all-empty ones (dummy dn group) on some
    # rank and iteration, and ones with boxes.
    assert 0 in gt and max(gt) > 0


def test_upstream_empty_batch_behaviour_hangs(tmp_path):
    """Negative control: with upstream's empty-batch behaviour the GT-less
    rank leaves the dn class embedding out of its graph, DDP's gradient
    all-reduce of the rank with boxes never completes, and the run hangs in
    its first iteration until the collective timeout (what users saw as an
    NCCL timeout); no iteration is logged."""
    output, _ = _train(
        str(tmp_path),
        'odd',
        False,
        model_type='DFINEUpstreamEmptyDn',
        extra=[f'env_cfg.dist_cfg.timeout={CONTROL_TIMEOUT_S}'],
        check=False)
    assert output.returncode != 0
    assert logged_iters(output.stdout) == []
    assert f'Timed out waiting {CONTROL_TIMEOUT_S * 1000}ms' in output.stdout
    # The rank with boxes is stuck in its train step (the gradient
    # all-reduce), the GT-less one already past it.
    assert 'rank 0: iter 1, train step (forward/backward/step)' in (
        output.stdout)
    assert 'rank 1: iter 1, after train step' in output.stdout
