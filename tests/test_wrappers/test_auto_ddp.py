"""AutoDDP on real gloo ranks with real Runner training of tiny DINO."""
import time

import pytest
import torch

from mmddp_ext.testing import MultiRankError, run_on_ranks
from mmddp_ext.wrappers.auto_ddp import group_param_names

from ..helpers import build_runner, rank0_log

HEAD = 'model.bbox_head.type'


class _SnapshotInitialParams:
    """Hook that records the parameters before the first step."""
    priority = 'VERY_HIGH'

    def __init__(self):
        self.params = None

    def __getattr__(self, name):  # every other hook stage: no-op
        if name.startswith(('before_', 'after_')):
            return lambda *args, **kwargs: None
        raise AttributeError(name)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if self.params is None:
            self.params = {n: p.detach().clone() for n, p in
                           runner.model.module.named_parameters()}


def _train(work_dir, data_root, iters, overrides):
    """Train on this rank; report the wrapper's state and rank 0's params."""
    import torch.distributed as dist
    from mmengine.hooks import Hook
    from . import ddp_probe_heads  # noqa: F401  (registers the heads)
    runner = build_runner(work_dir, data_root, iters, overrides)
    snapshot = type('Snapshot', (_SnapshotInitialParams, Hook), {})()
    runner.register_hook(snapshot)
    runner.train()
    ddp = runner.model
    params = None
    if dist.get_rank() == 0:
        params = {n: p.detach().clone()
                  for n, p in ddp.module.named_parameters()}
    return dict(
        wrapper=type(ddp).__name__,
        decision=getattr(ddp, 'autoddp_decision', None),
        find_unused=ddp.find_unused_parameters,
        ignored=sorted(ddp.parameters_to_ignore),
        static_graph=ddp.static_graph,
        params=params,
        initial=snapshot.params if params is not None else None)


def _run(tmp_path, synthetic_root, world_size, overrides, iters=3,
         name='work'):
    work_dir = str(tmp_path / name)
    results = run_on_ranks(
        _train, world_size,
        args=(work_dir, synthetic_root, iters, overrides), timeout=150)
    return work_dir, results


@pytest.mark.parametrize('world_size', [2, 3])
def test_unused_param_trains_without_flag(tmp_path, synthetic_root,
                                          world_size):
    work_dir, results = _run(
        tmp_path, synthetic_root, world_size, {
            HEAD: 'DINOHeadWithUnusedParam',
            'model_wrapper_cfg': dict(type='AutoDDP')
        })
    for res in results:
        assert res['wrapper'] == 'AutoDDP'
        assert res['decision']['mode'] == 'ignore_unused'
        assert res['find_unused'] is False  # no per-step graph traversal
        assert res['ignored'] == ['bbox_head.unused_scale']
    # Never received a gradient: AdamW's weight decay did not touch it.
    assert results[0]['params']['bbox_head.unused_scale'].item() == 1.0
    log = rank0_log(work_dir)
    decision_lines = [line for line in log.splitlines() if 'AutoDDP:' in line]
    assert len(decision_lines) == 1
    assert 'bbox_head.unused_scale' in decision_lines[0]
    assert 'find_unused_parameters=False' in decision_lines[0]


def test_stock_ddp_fails_on_the_same_model(tmp_path, synthetic_root):
    """The problem AutoDDP removes, shown with the same model."""
    with pytest.raises(MultiRankError) as info:
        _run(tmp_path, synthetic_root, 2, {
            HEAD: 'DINOHeadWithUnusedParam',
            'model_wrapper_cfg': dict(type='MMDistributedDataParallel')
        })
    assert 'Expected to have finished reduction' in str(info.value)


def test_same_params_as_hand_configured_ddp(tmp_path, synthetic_root):
    iters = 4
    overrides = {HEAD: 'DINOHeadWithUnusedParam'}
    _, auto = _run(
        tmp_path, synthetic_root, 2,
        dict(overrides, model_wrapper_cfg=dict(type='AutoDDP')), iters,
        'auto')
    _, hand = _run(
        tmp_path, synthetic_root, 2,
        dict(overrides, model_wrapper_cfg=dict(
            type='MMDistributedDataParallel', find_unused_parameters=True)),
        iters, 'hand')
    assert hand[0]['find_unused'] is True
    auto_params, hand_params = auto[0]['params'], hand[0]['params']
    assert auto_params.keys() == hand_params.keys()
    for name, value in auto_params.items():
        torch.testing.assert_close(
            value, hand_params[name], rtol=1e-6, atol=1e-7, msg=name)
    initial = auto[0]['initial']
    moved = [n for n, v in auto_params.items() if not torch.equal(
        v, initial[n])]
    # Training really happened: all but the unused parameter moved.
    assert set(initial) - set(moved) == {'bbox_head.unused_scale'}
    assert hand_params['bbox_head.unused_scale'].item() == 1.0


@pytest.mark.parametrize('world_size', [2, 3])
def test_branch_used_on_one_rank_trains(tmp_path, synthetic_root,
                                        world_size):
    _, results = _run(
        tmp_path, synthetic_root, world_size, {
            HEAD: 'DINOHeadRankZeroBranch',
            'model_wrapper_cfg': dict(type='AutoDDP')
        })
    for res in results:
        assert res['decision']['mode'] == 'find_unused'
        assert res['find_unused'] is True
        assert any('rank0_branch' in n
                   for n in res['decision']['partially_used'])
    # Rank 0's branch gradient was averaged into every replica: trained.
    weight = results[0]['params']['bbox_head.rank0_branch.weight']
    assert torch.isfinite(weight).all()


def test_nothing_unused_runs_the_fast_path(tmp_path, synthetic_root):
    _, results = _run(tmp_path, synthetic_root, 2,
                      {'model_wrapper_cfg': dict(type='AutoDDP')})
    for res in results:
        assert res['decision']['mode'] == 'static'
        assert res['find_unused'] is False
        assert res['ignored'] == []
        assert res['static_graph'] is False


def test_param_going_unused_later_stops_with_clear_message(
        tmp_path, synthetic_root):
    start = time.monotonic()
    with pytest.raises(MultiRankError) as info:
        _run(tmp_path, synthetic_root, 2, {
            HEAD: 'DINOHeadGoesUnusedLater',
            'model_wrapper_cfg': dict(type='AutoDDP')
        }, iters=6)
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert 'UnexpectedUnusedParameterError' in message
    assert 'AutoDDP (rank 1)' in message
    assert 'bbox_head.late_branch.{weight,bias}' in message
    assert "find_unused_parameters=True" in message
    assert elapsed < 120, f'took {elapsed:.0f}s: a hang, not a fast stop'


def test_explicit_flag_is_honoured_and_disagreement_logged(
        tmp_path, synthetic_root):
    work_dir, results = _run(
        tmp_path, synthetic_root, 2, {
            'model_wrapper_cfg': dict(
                type='AutoDDP', find_unused_parameters=True)
        })
    assert all(r['find_unused'] is True for r in results)
    log = rank0_log(work_dir)
    assert 'find_unused_parameters=True was set, but every' in log


def test_group_param_names_truncates():
    names = [f'head.layer{i}.weight' for i in range(12)] + ['head.bias']
    text = group_param_names(names, max_groups=3)
    assert text.startswith('head.layer0.weight, head.layer1.weight')
    assert '(+10 more modules)' in text
    assert group_param_names(['a.w', 'a.b']) == 'a.{w,b}'


def test_bad_flag_type_is_refused():
    from mmddp_ext.wrappers import AutoDDP
    with pytest.raises(TypeError, match='find_unused_parameters must be'):
        AutoDDP(torch.nn.Linear(2, 2), find_unused_parameters='yes')
