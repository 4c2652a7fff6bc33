"""CheckpointConflictHook: unit tests and real 2-rank gloo training."""
from types import SimpleNamespace

import pytest
import torch
import torch.utils.checkpoint as torch_checkpoint
from mmdet.models.backbones import ResNet

from mmddp_ext.hooks import CheckpointConflictHook
from mmddp_ext.testing import MultiRankError, run_on_ranks
from mmddp_ext.utils import activation_checkpoint as act_cp

from ..helpers import build_runner, rank0_log


def test_policy_is_validated():
    with pytest.raises(ValueError, match="unknown policy 'reentrant'.*"
                       "'non_reentrant', 'disable', 'error'"):
        CheckpointConflictHook(policy='reentrant')
    with pytest.raises(TypeError, match='policy must be a str'):
        CheckpointConflictHook(policy=1)


def test_finds_resnet_blocks_only_when_on():
    sites = act_cp.find_checkpoint_sites(ResNet(depth=18, with_cp=True))
    assert [s.name for s in sites] == [
        f'layer{i}.{j}' for i in range(1, 5) for j in range(2)
    ]
    assert all(s.switchable and not s.explicit_reentrant for s in sites)
    assert act_cp.find_checkpoint_sites(ResNet(depth=18)) == []
    assert act_cp.config_key(ResNet(depth=18), 'layer1.0') == 'model.with_cp'
    detector = torch.nn.Module()
    detector.backbone = ResNet(depth=18, with_cp=True)
    assert act_cp.config_key(detector,
                             'backbone.layer1.0') == 'model.backbone.with_cp'


def test_non_reentrant_scope_applies_only_inside_marked_modules(
        monkeypatch):
    seen = []

    def spy(function, *args, **kwargs):
        seen.append(kwargs.get('use_reentrant'))
        return function(*args)

    monkeypatch.setattr(torch_checkpoint, 'checkpoint', spy)
    marked, plain = ResNet(depth=18, with_cp=True), ResNet(
        depth=18, with_cp=True)
    for site in act_cp.find_checkpoint_sites(marked):
        act_cp.mark_non_reentrant(site.module)
    x = torch.randn(1, 3, 64, 64, requires_grad=True)
    marked(x)
    assert seen == [False] * 8
    seen.clear()
    plain(x)
    assert seen == [None] * 8  # untouched: torch's default applies


def _grads(model, x):
    model.zero_grad()
    sum((out**2).mean() for out in model(x)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_non_reentrant_gradients_equal_no_checkpointing():
    torch.manual_seed(0)
    reference = ResNet(depth=18, out_indices=(1, 2, 3))
    checkpointed = ResNet(depth=18, out_indices=(1, 2, 3), with_cp=True)
    checkpointed.load_state_dict(reference.state_dict())
    for site in act_cp.find_checkpoint_sites(checkpointed):
        act_cp.mark_non_reentrant(site.module)
    x = torch.randn(2, 3, 96, 96)
    expected, actual = _grads(reference, x), _grads(checkpointed, x)
    for name, grad in expected.items():
        torch.testing.assert_close(
            actual[name], grad, rtol=1e-6, atol=1e-8, msg=name)


def _policy_outcomes():
    """On one gloo rank: each policy against a real DDP wrapper."""
    from mmengine.model import MMDistributedDataParallel
    outcomes = {}
    for policy in ('non_reentrant', 'disable', 'error'):
        backbone = ResNet(depth=18, with_cp=True)
        ddp = MMDistributedDataParallel(backbone, find_unused_parameters=True)
        runner = SimpleNamespace(model=ddp)
        hook = CheckpointConflictHook(policy=policy)
        try:
            hook.before_train(runner)
            outcomes[policy] = dict(
                resolved=hook.resolved,
                with_cp=[b.with_cp for b in backbone.layer1],
                marked=act_cp.is_marked_non_reentrant(backbone.layer1[0]))
        except ValueError as error:
            outcomes[policy] = str(error)
    fast = MMDistributedDataParallel(
        ResNet(depth=18, with_cp=True), find_unused_parameters=False)
    hook = CheckpointConflictHook()
    hook.before_train(SimpleNamespace(model=fast))
    outcomes['no_conflict'] = hook.resolved
    hook = CheckpointConflictHook()
    hook.before_train(SimpleNamespace(model=ResNet(depth=18, with_cp=True)))
    outcomes['not_ddp'] = hook.resolved
    return outcomes


def test_policies_against_a_real_ddp_wrapper():
    out = run_on_ranks(_policy_outcomes, 1, timeout=60)[0]
    assert len(out['non_reentrant']['resolved']) == 8
    assert out['non_reentrant']['marked'] is True
    assert out['non_reentrant']['with_cp'] == [True, True]
    assert out['disable']['with_cp'] == [False, False]
    assert out['disable']['marked'] is False
    assert 'Set model.with_cp=False, or use' in out['error']
    assert 'layer1.0' in out['error']
    assert out['no_conflict'] == []  # checked, nothing changed
    assert out['not_ddp'] is None  # a note, no change, no crash


EXTENDED = {
    'model.backbone.with_cp': True,
    'model.bbox_head.type': 'DINOHeadRankZeroBranch',
    'model_wrapper_cfg': dict(type='AutoDDP'),
}


def _train(work_dir, data_root, overrides):
    from ..test_wrappers import ddp_probe_heads  # noqa: F401
    runner = build_runner(work_dir, data_root, 3, overrides)
    runner.train()
    return runner.model.find_unused_parameters


def test_with_cp_and_extended_head_train_with_the_hook(
        tmp_path, synthetic_root):
    work_dir = str(tmp_path / 'hook')
    overrides = dict(
        EXTENDED, custom_hooks=[dict(type='CheckpointConflictHook')])
    results = run_on_ranks(
        _train, 2, args=(work_dir, synthetic_root, overrides), timeout=150)
    assert results == [True, True]  # AutoDDP needed find_unused
    log = rank0_log(work_dir)
    assert ('made checkpointing non-reentrant in 8 module(s): '
            'backbone.layer1.0') in log


def test_same_run_without_the_hook_fails_with_ddp_error(
        tmp_path, synthetic_root):
    without_hook = dict(EXTENDED,
                        **{'mmddp_ext_cfg.checkpoint_conflict': None})
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            _train, 2,
            args=(str(tmp_path / 'nohook'), synthetic_root, without_hook),
            timeout=150)
    assert 'Expected to mark a variable ready only once' in str(info.value)
