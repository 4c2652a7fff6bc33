"""RankConsistencyHook: unit tests, a tiny model on 3 real gloo ranks (with
NonFiniteSkipHook beside it), and real 2-rank DINO training (fails fast
where stock DDP hangs)."""
import time
from types import SimpleNamespace

import pytest
import torch

from mmddp_ext.hooks import NonFiniteSkipHook, RankConsistencyHook
from mmddp_ext.hooks.rank_consistency_hook import (describe_divergence,
                                                   loss_keys_hash)
from mmddp_ext.testing import MultiRankError, run_on_ranks
from .hook_drivers import (dino_overrides, fake_runner, tiny_params,
                           train_dino, train_steps)

STOCK_DDP = dict(
    type='MMDistributedDataParallel', find_unused_parameters=False)
RANK_CONSISTENCY = dict(type='RankConsistencyHook')


# ------------------------------------------------------------------ unit
@pytest.mark.parametrize('kwargs, error, words', [
    (dict(check_first=-1), ValueError, 'check_first .* >= 0, but got -1'),
    (dict(check_every=-1), ValueError, 'check_every .* >= 0, but got -1'),
    (dict(check_every=2.5), TypeError, "check_every .* got 2.5 \\(float"),
    (dict(skip_nonfinite=True), TypeError,
     "got \\['skip_nonfinite'\\], but it only checks that the ranks agree"),
    (dict(check_evrey=5), TypeError,
     "unexpected argument\\(s\\) \\['check_evrey'\\]; it takes "
     'check_first and check_every'),
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


# ------------------------------------------------- tiny model, real ranks
def _tiny_scenarios():
    """On each rank: one step per scenario, every one checked."""
    import torch.distributed as dist

    from .rank_divergence_models import TinyDivergingModel, tiny_batch
    torch.manual_seed(0)
    runner = fake_runner(TinyDivergingModel())
    checks, skips = RankConsistencyHook(check_first=10), NonFiniteSkipHook()
    runner.hooks = [checks, skips]
    for hook in runner.hooks:
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
    params = [tiny_params(runner.model)]
    outcomes = []
    for scenario, num_gt in steps:
        outcomes += train_steps(runner.hooks, runner, [tiny_batch(num_gt)],
                                [scenario])
        params.append(tiny_params(runner.model))
    return dict(
        outcomes=outcomes,
        params=params,
        checks=checks.checks,
        skips=skips.total_skips)


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
def test_extra_loss_key_on_rank1_fails_in_the_first_iteration(
        tmp_path, synthetic_root):
    overrides = dino_overrides(
        'DINOHeadExtraKeyOnRank1', [RANK_CONSISTENCY],
        model_wrapper_cfg=STOCK_DDP)
    started = time.monotonic()
    results = run_on_ranks(
        train_dino,
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
    overrides = dino_overrides(
        'DINOHeadExtraKeyOnRank1', model_wrapper_cfg=STOCK_DDP)
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            train_dino,
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
    overrides = dino_overrides(
        'DINOHeadExtraKeyOnRank1',
        model_wrapper_cfg=STOCK_DDP,
        # Plain MMEngine: none of the stack's hooks (PreemptionHook's
        # per-iteration agreement is a collective between the steps too).
        **{'mmddp_ext_cfg.empty_gt_stats': False,
           'mmddp_ext_cfg.checkpoint_conflict': None,
           'mmddp_ext_cfg.preemption': None})
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            train_dino,
            2,
            args=(str(tmp_path), synthetic_root, 3, overrides),
            timeout=120)  # 3x its loaded time; a hang fails too
    message = str(info.value)
    rank0 = message.split('===== rank 1')[0]
    assert 'Expected to have finished reduction in the prior iteration' \
        in rank0
    assert 'Iter(train) [1/3]' in rank0  # it failed in iteration 2
    assert 'loss_aux' not in message
