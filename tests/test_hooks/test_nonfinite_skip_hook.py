"""NonFiniteSkipHook: unit tests, real 2-rank DINO training (NaN steps
skipped on every rank together), and the skip settings RankConsistencyHook
used to hold, refused there."""
import time

import pytest
import torch

from mmddp_ext.hooks import NonFiniteSkipHook, RankConsistencyHook
from mmddp_ext.hooks.nonfinite_skip_hook import SKIPS_SCALAR
from mmddp_ext.hooks.rank_consistency_hook import MOVED_TO_NONFINITE_SKIP
from mmddp_ext.runner import ExtRunner
from mmddp_ext.testing import run_on_ranks
from ..helpers import ToyModel, rank0_log
from .hook_drivers import (dino_overrides, fake_runner, tiny_params,
                           train_dino, train_steps)

NONFINITE_SKIP = dict(type='NonFiniteSkipHook')


# ------------------------------------------------------------------ unit
@pytest.mark.parametrize('kwargs, error, words', [
    (dict(max_consecutive_skips=True), TypeError,
     'max_consecutive_skips .* got True \\(bool'),
    (dict(max_consecutive_skips=0), ValueError,
     'max_consecutive_skips .* >= 1, but got 0'),
])
def test_config_is_validated(kwargs, error, words):
    with pytest.raises(error, match=words):
        NonFiniteSkipHook(**kwargs)


@pytest.mark.parametrize('kwargs', [
    dict(max_consecutive_skips=2),
    dict(skip_nonfinite=True),
    dict(skip_nonfinite=False, check_every=7),
])
def test_rank_consistency_hook_refuses_the_skip_arguments(kwargs):
    with pytest.raises(TypeError) as info:
        RankConsistencyHook(**kwargs)
    moved = sorted(set(kwargs) & set(MOVED_TO_NONFINITE_SKIP))
    assert str(info.value).startswith(
        f'RankConsistencyHook got {moved}, but it only checks that the '
        "ranks agree; skipping steps with a non-finite loss is "
        "NonFiniteSkipHook's. Remove them here and add "
        "dict(type='NonFiniteSkipHook', max_consecutive_skips=N)")


def test_single_process_skips_nonfinite_steps_and_stops_at_the_limit():
    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    runner = fake_runner(TinyDivergingModel())
    hook = NonFiniteSkipHook(max_consecutive_skips=2)
    hook.before_train(runner)
    params = [tiny_params(runner.model)]
    outcomes = []
    for scenario in ('same', 'nan_on_0', 'same', 'nan_on_0', 'nan_on_0'):
        outcomes += train_steps(hook, runner, [tiny_batch(1)], [scenario])
        params.append(tiny_params(runner.model))
    assert outcomes[:4] == [None] * 4
    assert outcomes[4].startswith(
        'NonFiniteLossError: NonFiniteSkipHook: 2 optimizer steps in a '
        'row were skipped for a non-finite (NaN/inf) loss, the last in '
        'iteration 5 (rank 0: loss_extra)')
    steps_taken = [not torch.equal(a, b) for a, b in zip(params, params[1:])]
    assert steps_taken == [True, False, True, False, False]
    assert hook.total_skips == 3
    assert runner.message_hub.get_scalar(SKIPS_SCALAR).current() == 3
    hook.after_train(runner)
    assert 'parse_losses' not in runner.model.__dict__  # restored
    assert 'step' not in runner.optim_wrapper.__dict__


@pytest.mark.parametrize('hooks, skipped', [
    ([NonFiniteSkipHook], True),
    ([RankConsistencyHook, NonFiniteSkipHook], True),
    # Negative control: RankConsistencyHook checks and nothing else (it
    # skipped by default before the split); the NaN step reaches the
    # parameters, as with no hook at all.
    ([RankConsistencyHook], False),
    ([], False),
])
def test_only_nonfinite_skip_hook_skips(hooks, skipped):
    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    runner = fake_runner(TinyDivergingModel())
    runner.hooks = [hook_type() for hook_type in hooks]
    for hook in runner.hooks:
        hook.before_train(runner)
    before = tiny_params(runner.model)
    train_steps(runner.hooks, runner, [tiny_batch(1)], ['nan_on_0'])
    after = tiny_params(runner.model)
    assert torch.equal(after, before) is skipped
    assert bool(torch.isfinite(after).all()) is skipped
    for hook in runner.hooks:
        hook.after_train(runner)
    assert 'parse_losses' not in runner.model.__dict__
    assert 'step' not in runner.optim_wrapper.__dict__


def test_nonfinite_loss_in_an_accumulated_iteration_skips_the_step():
    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    runner = fake_runner(TinyDivergingModel(), accumulative_counts=2)
    hook = NonFiniteSkipHook()
    hook.before_train(runner)
    params = [tiny_params(runner.model)]
    for scenario in ('nan_on_0', 'same', 'same', 'same'):
        assert train_steps(hook, runner, [tiny_batch(1)], [scenario]) == [None]
        params.append(tiny_params(runner.model))
    steps_taken = [not torch.equal(a, b) for a, b in zip(params, params[1:])]
    # Steps come every 2nd iteration; the first one carried the NaN.
    assert steps_taken == [False, False, False, True]
    assert hook.total_skips == 1
    assert torch.isfinite(params[-1]).all()


# --------------------------------------------------- the config's keys
def _hooks_and_log(tmp_path, ext_cfg):
    runner = ExtRunner(
        model=ToyModel(),
        work_dir=str(tmp_path),
        experiment_name=f'nonfinite_skip_{time.time_ns()}',  # its own log
        cfg=dict(mmddp_ext_cfg=ext_cfg))
    hooks = {type(h).__name__: h for h in runner.hooks}
    return hooks, rank0_log(str(tmp_path))


@pytest.mark.parametrize('rank_consistency', [
    dict(max_consecutive_skips=2, check_every=7),
    dict(skip_nonfinite=False),
])
def test_skip_keys_under_rank_consistency_are_refused(tmp_path,
                                                      rank_consistency):
    with pytest.raises(ValueError) as info:
        _hooks_and_log(tmp_path, dict(rank_consistency=rank_consistency))
    moved = sorted(set(rank_consistency) & set(MOVED_TO_NONFINITE_SKIP))
    assert str(info.value) == (
        f'mmddp_ext_cfg.rank_consistency sets {moved}, but '
        'RankConsistencyHook only checks that the ranks agree; skipping '
        "steps with a non-finite loss is NonFiniteSkipHook's, under "
        'mmddp_ext_cfg.nonfinite_skip. Remove them from rank_consistency '
        'and set nonfinite_skip=dict(max_consecutive_skips=N) to skip (N '
        'defaults to 5), or nonfinite_skip=None not to.')


def test_nonfinite_skip_alone_decides_skipping(tmp_path):
    hooks, _ = _hooks_and_log(
        tmp_path / 'on',
        dict(rank_consistency=dict(check_every=7),
             nonfinite_skip=dict(max_consecutive_skips=2)))
    assert hooks['RankConsistencyHook'].check_every == 7
    assert hooks['NonFiniteSkipHook'].max_consecutive_skips == 2
    # Before the split, rank_consistency alone also skipped.
    hooks, _ = _hooks_and_log(tmp_path / 'off', dict(rank_consistency=dict()))
    assert 'RankConsistencyHook' in hooks
    assert 'NonFiniteSkipHook' not in hooks


# ------------------------------------------------ real DINO, 2 gloo ranks
def test_nan_on_rank0_skips_the_same_step_on_every_rank(
        tmp_path, synthetic_root):
    overrides = dino_overrides('DINOHeadNaNOnRank', [NONFINITE_SKIP])
    overrides['model.bbox_head.nan_calls'] = (2, )
    results = run_on_ranks(
        train_dino,
        2,
        args=(str(tmp_path), synthetic_root, 3, overrides),
        timeout=150)
    rank0, rank1 = results
    assert rank0['error'] is None and rank1['error'] is None
    assert rank0['skips'] == rank1['skips'] == 1
    assert rank0['digests'] == rank1['digests']  # identical replicas
    first, skipped, third = rank0['digests']
    assert skipped == first  # the NaN step changed nothing
    assert third != skipped  # and training went on
    log = rank0_log(str(tmp_path))
    assert ('NonFiniteSkipHook: non-finite loss in iteration 2 (rank 0: '
            'd0.loss_bbox, loss_bbox); skipped this optimizer step on every '
            'rank (1 in a row, 1 in total') in log
    assert 'nonfinite_skips: 1' in log


def test_consecutive_nonfinite_losses_stop_every_rank(tmp_path,
                                                      synthetic_root):
    overrides = dino_overrides('DINOHeadNaNOnRank',
                               [dict(NONFINITE_SKIP, max_consecutive_skips=2)])
    overrides['model.bbox_head.nan_calls'] = (1, 2)
    results = run_on_ranks(
        train_dino,
        2,
        args=(str(tmp_path), synthetic_root, 3, overrides),
        timeout=150)
    assert results[0]['error'] == results[1]['error']
    assert results[0]['error'].startswith(
        'NonFiniteLossError: NonFiniteSkipHook: 2 optimizer steps in a '
        'row were skipped for a non-finite (NaN/inf) loss, the last in '
        'iteration 2 (rank 0: d0.loss_bbox, loss_bbox)')
    assert [r['iters_done'] for r in results] == [1, 1]
