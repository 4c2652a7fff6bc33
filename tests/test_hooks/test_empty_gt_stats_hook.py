"""EmptyGTStatsHook with a Mock runner, and its gather on real gloo ranks."""
import logging
import uuid
from unittest.mock import Mock

import pytest
from mmengine.config import Config
from mmengine.hooks import LoggerHook
from mmengine.logging import MessageHub, MMLogger

from mmddp_ext.datasets import empty_gt_guard_collate, reset_empty_gt_guard
from mmddp_ext.hooks import EmptyGTStatsHook
from mmddp_ext.testing import run_on_ranks
from ..test_datasets.packed import packed_batch

PREFIX = 'train/empty_gt/'


def _runner(cfg=None, log_interval=2, loader_len=100):
    runner = Mock()
    runner.message_hub = MessageHub(f'empty_gt_test_{uuid.uuid4().hex}')
    runner.train_dataloader = [None] * loader_len
    runner.hooks = [LoggerHook(interval=log_interval)]
    runner.cfg = Config(cfg or {})
    return runner


def _scalars(runner):
    return {
        key[len(PREFIX):]: buffer.current()
        for key, buffer in runner.message_hub.log_scalars.items()
        if key.startswith(PREFIX)
    }


def _guarded(gt_counts, first_id, policy='swap'):
    return empty_gt_guard_collate(
        packed_batch(gt_counts, first_id), policy=policy)


def _feed(hook, runner, batches, first_idx=0):
    for batch_idx, batch in enumerate(batches, first_idx):
        hook.after_train_iter(runner, batch_idx, data_batch=batch)


class _Records(logging.Handler):

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append((record.levelno, record.getMessage()))


@pytest.fixture
def logged():
    reset_empty_gt_guard()
    logger = MMLogger.get_current_instance()
    handler = _Records()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)
    reset_empty_gt_guard()


def test_counts_reach_the_message_hub_at_the_log_interval(logged):
    runner = _runner()
    hook = EmptyGTStatsHook()
    hook.before_train(runner)
    batches = [
        _guarded([0, 0], 0),  # all-empty, reservoir cold: fallback
        _guarded([3, 0], 2),
        _guarded([0, 0], 4),  # all-empty: swapped
        _guarded([1, 2], 6),
    ]
    _feed(hook, runner, batches[:1])
    assert _scalars(runner) == {}  # LoggerHook interval 2: not yet
    _feed(hook, runner, [None], 1)  # not a detection batch: ignored
    assert _scalars(runner) == dict(
        rank0_empty_samples=2,
        rank0_all_empty_batches=1,
        rank0_swaps=0,
        rank0_fallbacks=1,
        empty_ratio=1.0)
    _feed(hook, runner, batches[1:] + [None], 2)  # published at 5
    assert _scalars(runner) == dict(
        rank0_empty_samples=5,
        rank0_all_empty_batches=2,
        rank0_swaps=1,
        rank0_fallbacks=1,
        empty_ratio=5 / 8)
    warnings = [m for level, m in logged if level == logging.WARNING]
    assert sum('could not fix' in m for m in warnings) == 1

    hook.after_train(runner)
    summary = [m for _, m in logged if 'training batches without GT' in m]
    assert summary and ('rank 0: 5/8 samples without GT, 2 all-empty '
                        'batches, 1 swaps, 1 fallbacks') in summary[0]


def test_counts_pseudo_collate_batches_and_logs_sums_without_per_rank():
    from mmengine.dataset import pseudo_collate
    runner = _runner(log_interval=1)
    hook = EmptyGTStatsHook(per_rank=False, interval=3)
    hook.before_train(runner)
    _feed(hook, runner, [
        pseudo_collate(packed_batch(counts))
        for counts in ([0, 0], [0, 1], [0, 0])
    ])
    assert _scalars(runner) == dict(
        empty_samples=5,
        all_empty_batches=2,
        swaps=0,
        fallbacks=0,
        empty_ratio=5 / 6)


def test_unannotated_batches_are_not_counted():
    from mmengine.dataset import pseudo_collate

    from ..test_datasets.packed import packed_item
    runner = _runner(log_interval=1)
    hook = EmptyGTStatsHook()
    hook.before_train(runner)
    batch = [packed_item(0, i, with_annotations=False) for i in range(2)]
    _feed(hook, runner, [pseudo_collate(batch)])
    assert _scalars(runner)['rank0_empty_samples'] == 0
    assert _scalars(runner)['empty_ratio'] == 0.0


@pytest.mark.parametrize('loader', ['val_dataloader', 'test_dataloader'])
def test_guard_on_evaluation_dataloader_is_refused(loader):
    runner = _runner(
        {loader: dict(collate_fn=dict(type='empty_gt_guard_collate'))})
    with pytest.raises(
            ValueError,
            match=f'{loader}.collate_fn is '
            'empty_gt_guard_collate, which is for training'):
        EmptyGTStatsHook().before_train(runner)


def test_bad_train_guard_config_fails_before_training():
    runner = _runner({
        'train_dataloader':
        dict(collate_fn=dict(type='empty_gt_guard_collate', policy='drop'))
    })
    with pytest.raises(
            ValueError,
            match=r"policy must be one of \('keep', "
            r"'swap', 'error'\), but got 'drop'"):
        EmptyGTStatsHook().before_train(runner)


@pytest.mark.parametrize('kwargs, message', [
    (dict(interval=0), 'interval must be None'),
    (dict(interval='10'), "'10' \\(str\\)"),
    (dict(per_rank='yes'), "per_rank must be True.*'yes' \\(str\\)"),
])
def test_bad_hook_arguments_raise_value_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EmptyGTStatsHook(**kwargs)


def test_base_config_switches_the_hook_on(repo_root):
    cfg = Config.fromfile(f'{repo_root}/configs/dino_tiny.py')
    assert cfg.mmddp_ext_cfg.empty_gt_stats is True  # ExtRunner adds it
    for loader in ('val_dataloader', 'test_dataloader'):
        assert 'collate_fn' not in cfg[loader]
    EmptyGTStatsHook().before_train(_runner(cfg.to_dict()))


def test_registered_in_root_hooks():
    from mmengine.registry import HOOKS
    hook = HOOKS.build(dict(type='EmptyGTStatsHook', interval=5))
    assert isinstance(hook, EmptyGTStatsHook) and hook.interval == 5


# rank r trains on RANK_BATCHES[r]; batch 1 is the end of the epoch.
RANK_BATCHES = {0: ([1, 0], [0, 2]), 1: ([0, 0], [0, 0])}


def _count_on_rank():
    import torch.distributed as dist
    rank = dist.get_rank()
    runner = _runner(log_interval=10, loader_len=2)
    hook = EmptyGTStatsHook()
    hook.before_train(runner)
    _feed(hook, runner, [
        _guarded(counts, 10 * i) for i, counts in enumerate(RANK_BATCHES[rank])
    ])
    return _scalars(runner)


def test_rank_zero_logs_every_ranks_counts_on_gloo():
    results = run_on_ranks(_count_on_rank, 2, timeout=90)
    expected = dict(
        rank0_empty_samples=2,
        rank0_all_empty_batches=0,
        rank0_swaps=0,
        rank0_fallbacks=0,
        # rank 1 never sees a box: both batches fall back.
        rank1_empty_samples=4,
        rank1_all_empty_batches=2,
        rank1_swaps=0,
        rank1_fallbacks=2,
        empty_ratio=6 / 8)
    # Published at the end of the epoch (batch 1), not at interval 10.
    assert results[0] == expected
    assert results[1] == expected
