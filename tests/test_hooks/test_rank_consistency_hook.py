"""RankConsistencyHook: unit tests, a tiny model on 3 real gloo ranks, and
real 2-rank DINO training (fails fast where stock DDP hangs; NaN steps
skipped on every rank together)."""
import time
from types import SimpleNamespace

import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper

from mmddp_ext.hooks import RankConsistencyHook
from mmddp_ext.hooks.rank_consistency_hook import (SKIPS_SCALAR,
                                                   NonFiniteLossError,
                                                   RankDivergenceError,
                                                   describe_divergence,
                                                   loss_keys_hash)
from mmddp_ext.testing import MultiRankError, run_on_ranks
from ..helpers import build_runner, rank0_log

HEAD = 'model.bbox_head.type'
# The config switches the hook on through ExtRunner; these tests add it
# themselves (or leave it out, for stock behaviour).
NO_STACK_HOOK = {'mmddp_ext_cfg.rank_consistency': None}
STOCK_DDP = dict(
    type='MMDistributedDataParallel', find_unused_parameters=False)


# ------------------------------------------------------------------ unit
@pytest.mark.parametrize('kwargs, error, words', [
    (dict(check_first=-1), ValueError, 'check_first .* >= 0, but got -1'),
    (dict(check_every=-1), ValueError, 'check_every .* >= 0, but got -1'),
    (dict(check_every=2.5), TypeError, "check_every .* got 2.5 \\(float"),
    (dict(max_consecutive_skips=True), TypeError,
     'max_consecutive_skips .* got True \\(bool'),
    (dict(skip_nonfinite='yes'), TypeError,
     "skip_nonfinite must be True .* or False, but got 'yes'"),
])
def test_config_is_validated(kwargs, error, words):
    with pytest.raises(error, match=words):
        RankConsistencyHook(**kwargs)


@pytest.mark.parametrize(
    'check_first, check_every, start, expected',
    [
        (3, 4, 0, [1, 2, 3, 4, 8, 12]),
        (0, 5, 0, [5, 10]),
        (2, 0, 0, [1, 2]),
        (2, 5, 6, [7, 8, 10]),  # resumed at iteration 6: its first two
    ])
def test_checked_iterations(check_first, check_every, start, expected):
    hook = RankConsistencyHook(
        check_first=check_first, check_every=check_every)
    checked = []
    for index in range(start, 12):
        hook.before_train_iter(SimpleNamespace(iter=index), index)
        if hook._check_now:
            checked.append(index + 1)  # as the log counts
    assert checked == expected


def test_loss_keys_hash_ignores_order_only():
    assert loss_keys_hash(['b', 'a']) == loss_keys_hash(['a', 'b'])
    assert loss_keys_hash(['a', 'b']) != loss_keys_hash(['a', 'b', 'c'])
    assert loss_keys_hash(['ab']) != loss_keys_hash(['a', 'b'])


def _details(keys, gt=3, iteration=4, collectives=2, trainable=10):
    return dict(
        iteration=iteration,
        loss_keys=sorted(keys),
        forward_collectives=collectives,
        trainable_params=trainable,
        gt_boxes=gt)


def test_message_groups_ranks_against_the_common_key_set():
    full = ['loss_cls', 'dn_loss_cls', 'dn_loss_bbox']
    message = describe_divergence([
        _details(full),
        _details(full[:1], gt=0),
        _details(full),
        _details(full[:1], gt=0),
        _details(full + ['loss_aux'])
    ])
    assert message.startswith('RankConsistencyHook: the ranks diverged in '
                              'iteration 4, before its backward')
    assert ('ranks 1, 3 are missing loss key(s) dn_loss_bbox, dn_loss_cls, '
            'compared with ranks 0, 2; GT boxes in the batch: rank 1: 0, '
            'rank 3: 0 (rank 0: 3, rank 2: 3). With 0 GT boxes, use the '
            "DDP-safe heads (model.type='DDPSafeDINO'") in message
    assert "empty_gt_guard_collate', policy='swap')" in message
    assert ('rank 4 has extra loss key(s) loss_aux, compared with ranks 0, '
            '2') in message
    assert message.count('\n- ') == 2


def test_message_names_iterations_collectives_and_trainable():
    message = describe_divergence([
        _details(['loss'], iteration=7, collectives=4, trainable=10),
        _details(['loss'], iteration=8, collectives=5, trainable=9)
    ])
    assert 'different iterations (rank 0: 7, rank 1: 8)' in message
    assert (
        'different numbers of collective calls (all_reduce, '
        'broadcast, ...) in this iteration (rank 0: 4, rank 1: 5)') in message
    assert 'requires_grad=True differs (rank 0: 10, rank 1: 9)' in message
    assert 'loss key' not in message


def _fake_runner(model, accumulative_counts=1):
    optim_wrapper = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1),
        accumulative_counts=accumulative_counts)
    hub = MessageHub.get_instance(f'rank_consistency_{time.time()}')
    return SimpleNamespace(
        model=model, optim_wrapper=optim_wrapper, message_hub=hub, iter=0)


def _train_steps(hook, runner, batches, scenarios=None):
    """Run ``BaseModel.train_step`` per batch with the hook's stages;
    returns each step's outcome (None, or the error message)."""
    outcomes = []
    for index, batch in enumerate(batches):
        if scenarios is not None:
            runner.model.scenario = scenarios[index]
        hook.before_train_iter(runner, index, batch)
        try:
            runner.model.train_step(batch, runner.optim_wrapper)
            outcomes.append(None)
        except (RankDivergenceError, NonFiniteLossError) as error:
            outcomes.append(f'{type(error).__name__}: {error}')
        hook.after_train_iter(runner, index, batch)
        runner.iter += 1
    return outcomes


def _tiny_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_single_process_skips_nonfinite_steps_and_stops_at_the_limit():
    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    runner = _fake_runner(TinyDivergingModel())
    hook = RankConsistencyHook(max_consecutive_skips=2)
    hook.before_train(runner)
    params = [_tiny_params(runner.model)]
    outcomes = []
    for scenario in ('same', 'nan_on_0', 'same', 'nan_on_0', 'nan_on_0'):
        outcomes += _train_steps(hook, runner, [tiny_batch(1)], [scenario])
        params.append(_tiny_params(runner.model))
    assert outcomes[:4] == [None] * 4
    assert outcomes[4].startswith(
        'NonFiniteLossError: RankConsistencyHook: 2 optimizer steps in a '
        'row were skipped for a non-finite (NaN/inf) loss, the last in '
        'iteration 5 (rank 0: loss_extra)')
    steps_taken = [not torch.equal(a, b) for a, b in zip(params, params[1:])]
    assert steps_taken == [True, False, True, False, False]
    assert hook.total_skips == 3 and hook.checks == 0  # nothing to compare
    assert runner.message_hub.get_scalar(SKIPS_SCALAR).current() == 3
    hook.after_train(runner)
    assert 'parse_losses' not in runner.model.__dict__  # restored
    assert 'step' not in runner.optim_wrapper.__dict__


def test_nonfinite_loss_in_an_accumulated_iteration_skips_the_step():
    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    runner = _fake_runner(TinyDivergingModel(), accumulative_counts=2)
    hook = RankConsistencyHook()
    hook.before_train(runner)
    params = [_tiny_params(runner.model)]
    for scenario in ('nan_on_0', 'same', 'same', 'same'):
        assert _train_steps(hook, runner, [tiny_batch(1)],
                            [scenario]) == [None]
        params.append(_tiny_params(runner.model))
    steps_taken = [not torch.equal(a, b) for a, b in zip(params, params[1:])]
    # Steps come every 2nd iteration; the first one carried the NaN.
    assert steps_taken == [False, False, False, True]
    assert hook.total_skips == 1
    assert torch.isfinite(params[-1]).all()


# ------------------------------------------------- tiny model, real ranks
def _tiny_scenarios():
    """On each rank: one step per scenario, every one checked."""
    import torch.distributed as dist

    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    torch.manual_seed(0)
    runner = _fake_runner(TinyDivergingModel())
    hook = RankConsistencyHook(check_first=10)
    hook.before_train(runner)
    last = dist.get_world_size() - 1
    steps = [
        ('same', 3),
        ('missing_on_last', 0 if dist.get_rank() == last else 2),
        ('nan_on_1', 1),
        ('same', 1),
        # Last: it leaves an unmatched all-reduce on rank 1.
        ('extra_collective_on_1', 1),
    ]
    params = [_tiny_params(runner.model)]
    outcomes = []
    for scenario, num_gt in steps:
        outcomes += _train_steps(hook, runner, [tiny_batch(num_gt)],
                                 [scenario])
        params.append(_tiny_params(runner.model))
    return dict(
        outcomes=outcomes,
        params=params,
        checks=hook.checks,
        skips=hook.total_skips)


def test_tiny_model_on_three_ranks():
    results = run_on_ranks(_tiny_scenarios, 3, timeout=60)
    same, missing, nan, recovered, collective = results[0]['outcomes']
    assert same is None and nan is None and recovered is None
    for result in results[1:]:  # every rank raised the same errors
        assert result['outcomes'] == results[0]['outcomes']
    assert missing.startswith('RankDivergenceError: RankConsistencyHook: '
                              'the ranks diverged in iteration 2')
    assert ('rank 2 is missing loss key(s) loss_extra, compared with ranks '
            '0, 1; GT boxes in the batch: rank 2: 0 (rank 0: 2, rank 1: 2)'
            '. With 0 GT boxes, use the DDP-safe heads') in missing
    assert collective.startswith('RankDivergenceError')
    assert ('collective calls (all_reduce, broadcast, ...) in this '
            'iteration (rank 0: 0, rank 1: 1, rank 2: 0)') in collective
    assert 'loss key' not in collective
    for result in results:
        params = result['params']
        steps_taken = [
            not torch.equal(a, b) for a, b in zip(params, params[1:])
        ]
        # The divergent steps stopped before the backward, the NaN step on
        # rank 1 was skipped on every rank, the next one ran.
        assert steps_taken == [True, False, False, True, False]
        assert torch.equal(params[-1], results[0]['params'][-1])
        assert result['skips'] == 1 and result['checks'] == 5


# ------------------------------------------------ real DINO, 2 gloo ranks
def _train(work_dir, data_root, iters, overrides):
    """Train on this rank; the outcome and a digest of the parameters
    after every iteration."""
    import hashlib

    from mmengine.hooks import Hook

    from . import rank_divergence_models  # noqa: F401
    digests = []

    class Digest(Hook):
        priority = 'LOWEST'

        def after_train_iter(self,
                             runner,
                             batch_idx,
                             data_batch=None,
                             outputs=None):
            sha = hashlib.sha256()
            for param in runner.model.module.parameters():
                sha.update(param.detach().numpy().tobytes())
            digests.append(sha.hexdigest())

    runner = build_runner(work_dir, data_root, iters, overrides)
    runner.register_hook(Digest())
    try:
        runner.train()
        error = None
    except (RankDivergenceError, NonFiniteLossError) as exc:
        error = f'{type(exc).__name__}: {exc}'
    hooks = [h for h in runner.hooks if isinstance(h, RankConsistencyHook)]
    return dict(
        error=error,
        iters_done=len(digests),
        digests=digests,
        skips=hooks[0].total_skips if hooks else None)


def _overrides(head, hook=None, **extra):
    overrides = dict(
        NO_STACK_HOOK, **{
            HEAD: head,
            'train_dataloader.sampler.shuffle': False,
        }, **extra)
    if hook is not None:
        overrides['custom_hooks'] = [dict(type='RankConsistencyHook', **hook)]
    return overrides


def test_extra_loss_key_on_rank1_fails_in_the_first_iteration(
        tmp_path, synthetic_root):
    overrides = _overrides(
        'DINOHeadExtraKeyOnRank1', hook={}, model_wrapper_cfg=STOCK_DDP)
    started = time.monotonic()
    results = run_on_ranks(
        _train,
        2,
        args=(str(tmp_path), synthetic_root, 3, overrides),
        timeout=120)
    elapsed = time.monotonic() - started
    assert results[0]['error'] == results[1]['error']
    error = results[0]['error']
    assert error.startswith('RankDivergenceError: RankConsistencyHook: the '
                            'ranks diverged in iteration 1, before its '
                            'backward')
    assert 'rank 1 has extra loss key(s) loss_aux, compared with rank 0' \
        in error
    assert [r['iters_done'] for r in results] == [0, 0]
    print(f'with the hook: both ranks stopped after {elapsed:.0f}s')


def test_same_model_hangs_without_the_hook(tmp_path, synthetic_root):
    """Rank 0 leaves the branch's gradient bucket unreduced; its next
    collective (EmptyGTStatsHook's all-gather at the log interval) pairs
    with rank 1's pending gradient all-reduce and both wait."""
    overrides = _overrides(
        'DINOHeadExtraKeyOnRank1', model_wrapper_cfg=STOCK_DDP)
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            _train,
            2,
            args=(str(tmp_path), synthetic_root, 3, overrides),
            timeout=25)
    message = str(info.value)
    assert 'timed out after 25s' in message.splitlines()[0]
    assert 'torch.meshgrid' in message  # the ranks got to a forward pass
    assert 'loss_aux' not in message  # nothing points at the cause


def test_same_model_on_plain_mmengine_fails_later_and_unrelated(
        tmp_path, synthetic_root):
    """Without a collective between the steps, DDP's own check stops rank
    0 one iteration later, naming neither rank 1 nor the loss key."""
    overrides = _overrides(
        'DINOHeadExtraKeyOnRank1',
        model_wrapper_cfg=STOCK_DDP,
        # Plain MMEngine: none of the stack's hooks.
        **{'mmddp_ext_cfg.empty_gt_stats': False,
           'mmddp_ext_cfg.checkpoint_conflict': None})
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            _train,
            2,
            args=(str(tmp_path), synthetic_root, 3, overrides),
            timeout=120)  # 3x its loaded time; a hang fails too
    message = str(info.value)
    rank0 = message.split('===== rank 1')[0]
    assert 'Expected to have finished reduction in the prior iteration' \
        in rank0
    assert 'Iter(train) [1/3]' in rank0  # it failed in iteration 2
    assert 'loss_aux' not in message


def test_nan_on_rank0_skips_the_same_step_on_every_rank(
        tmp_path, synthetic_root):
    overrides = _overrides('DINOHeadNaNOnRank', hook={})
    overrides['model.bbox_head.nan_calls'] = (2, )
    results = run_on_ranks(
        _train,
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
    assert ('non-finite loss in iteration 2 (rank 0: d0.loss_bbox, '
            'loss_bbox); skipped this optimizer step on every rank (1 in a '
            'row, 1 in total') in log
    assert 'nonfinite_skips: 1' in log


def test_consecutive_nonfinite_losses_stop_every_rank(tmp_path,
                                                      synthetic_root):
    overrides = _overrides(
        'DINOHeadNaNOnRank', hook=dict(max_consecutive_skips=2))
    overrides['model.bbox_head.nan_calls'] = (1, 2)
    results = run_on_ranks(
        _train,
        2,
        args=(str(tmp_path), synthetic_root, 3, overrides),
        timeout=150)
    assert results[0]['error'] == results[1]['error']
    assert results[0]['error'].startswith(
        'NonFiniteLossError: RankConsistencyHook: 2 optimizer steps in a '
        'row were skipped for a non-finite (NaN/inf) loss, the last in '
        'iteration 2 (rank 0: d0.loss_bbox, loss_bbox)')
    assert [r['iters_done'] for r in results] == [1, 1]
