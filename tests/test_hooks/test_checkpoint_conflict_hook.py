"""CheckpointConflictHook: unit tests, a backbone matrix on 2 real gloo
ranks (with its negative controls in the same spawn) and a full Runner
run."""
import sys
import types
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint
from mmdet.models.backbones import ResNet, ResNeXt
from mmengine.model import BaseModel

from mmddp_ext.hooks import CheckpointConflictHook
from mmddp_ext.launch.rank_launcher import FAILURE_GRACE_S, STARTUP_LIMIT_S
from mmddp_ext.testing import (MultiRankError, RunsInOneLaunch, on_rank_device,
                               run_on_ranks)
from mmddp_ext.utils import activation_checkpoint as act_cp
from ..helpers import build_runner, rank0_log

DDP_DOUBLE_READY = 'Expected to mark a variable ready only once'
TINY = dict(base_channels=8, stem_channels=8)


def stages(count):
    """Strides etc. of ``count`` stages of a ResNet-like backbone."""
    return dict(
        strides=(1, 2, 2, 2)[:count],
        dilations=(1, ) * count,
        out_indices=tuple(range(count)))


@pytest.fixture(autouse=True)
def _torch_behaviour_after_each_test():
    yield
    act_cp.reset()


def test_policy_is_validated():
    with pytest.raises(
            ValueError,
            match="unknown policy 'reentrant'.*"
            "'non_reentrant', 'disable', 'error'"):
        CheckpointConflictHook(policy='reentrant')
    with pytest.raises(TypeError, match='policy must be a str'):
        CheckpointConflictHook(policy=1)


def test_install_replaces_the_function_objects_by_identity():
    import mmdet.models.necks.hrfpn as hrfpn
    import mmengine.runner.activation_checkpointing as mmengine_cp
    act_cp.install()
    # `from torch.utils.checkpoint import checkpoint` (HRFPN, MMEngine)
    assert hrfpn.checkpoint is act_cp.checkpoint
    assert mmengine_cp.checkpoint is act_cp.checkpoint
    assert torch_checkpoint.checkpoint is act_cp.checkpoint
    assert torch_checkpoint.checkpoint_sequential is \
        act_cp.checkpoint_sequential
    # the module `torch.utils.checkpoint` itself keeps its name
    assert torch.utils.checkpoint is torch_checkpoint
    assert act_cp.install() == 0  # once is enough


def test_rebind_goes_by_identity_not_by_name():

    def original(function):
        return function()

    def wrapper(function):
        return function()

    def checkpoint(path):  # same name, another object
        return path

    by_name = types.ModuleType('imports_by_name')
    by_name.checkpoint, by_name.ckpt, by_name.other = (original, original,
                                                       checkpoint)
    sys.modules[by_name.__name__] = by_name
    try:
        assert act_cp.rebind(original, wrapper) == 2
    finally:
        del sys.modules[by_name.__name__]
    assert by_name.checkpoint is wrapper and by_name.ckpt is wrapper
    assert by_name.other is checkpoint


def test_policy_applies_to_calls_that_do_not_state_use_reentrant(monkeypatch):
    seen = []

    def spy(function, *args, use_reentrant=None, **kwargs):
        seen.append(use_reentrant)
        return function(*args, **kwargs)

    act_cp.install()
    monkeypatch.setitem(act_cp._originals, 'checkpoint', spy)
    layer = nn.Linear(2, 2)
    x = torch.randn(1, 2, requires_grad=True)
    torch_checkpoint.checkpoint(layer, x)
    act_cp.set_policy('non_reentrant')
    torch_checkpoint.checkpoint(layer, x)
    torch_checkpoint.checkpoint(layer, x, use_reentrant=True)
    with torch.no_grad():
        torch_checkpoint.checkpoint(layer, x)
    assert seen == [None, False, True, None]
    act_cp.set_policy('disable')
    plain = torch_checkpoint.checkpoint(layer, x, preserve_rng_state=False)
    assert torch.equal(plain, layer(x))
    assert len(seen) == 4  # ran without checkpointing
    act_cp.set_policy('error', refuse=lambda site: ValueError(f'at {site}'))
    with pytest.raises(ValueError, match='at None'):
        torch_checkpoint.checkpoint(layer, x)


def _grads(model, x):
    model.zero_grad()
    sum((out**2).mean() for out in model(x)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_inherited_forward_is_seen_and_made_non_reentrant():
    """ResNeXt's Bottleneck defines only __init__ and inherits the
    checkpointing forward of ResNet's Bottleneck."""
    torch.manual_seed(0)
    cfg = dict(
        depth=50, groups=2, base_width=4, num_stages=2, **stages(2), **TINY)
    reference, checkpointed = ResNeXt(**cfg), ResNeXt(with_cp=True, **cfg)
    checkpointed.load_state_dict(reference.state_dict())
    assert 'forward' not in type(checkpointed.layer1[0]).__dict__
    act_cp.watch(checkpointed)
    act_cp.set_policy('non_reentrant')
    x = torch.randn(2, 3, 32, 32)
    expected, actual = _grads(reference, x), _grads(checkpointed, x)
    assert act_cp.stop_recording() == {
        f'layer{i}.{j}': {None}
        for i in (1, 2)
        for j in range(len(getattr(checkpointed, f'layer{i}')))
    }
    for name, grad in expected.items():
        torch.testing.assert_close(
            actual[name], grad, rtol=1e-6, atol=1e-8, msg=name)


# --------------------------------------------------------- backbone matrix
class TinyDetector(BaseModel):
    """Backbone (+ neck) and a loss, with the two head parameters that make
    DDP look for unused parameters: ``unused`` never reaches the loss and
    ``rank0_scale`` reaches it on rank 0 only (AutoDDP then decides
    ``find_unused_parameters=True``)."""

    def __init__(self, backbone, neck=None):
        super().__init__()
        self.backbone, self.neck = backbone, neck
        self.unused = nn.Parameter(torch.zeros(1))
        self.rank0_scale = nn.Parameter(torch.ones(1))

    def forward(self, inputs, data_samples=None, mode='loss'):
        feats = self.backbone(inputs)
        if self.neck is not None:
            feats = self.neck(feats)
        loss = sum((feat**2).mean() for feat in feats)
        if dist.get_rank() == 0:
            loss = loss * self.rank0_scale
        return dict(loss=loss)


class SequentialStage(nn.Module):
    """A stem and four conv layers run by ``checkpoint_sequential``."""

    def __init__(self, with_cp):
        super().__init__()
        self.with_cp = with_cp
        self.stem = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.layers = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
            for _ in range(4)
        ])

    def forward(self, x):
        x = self.stem(x)
        if self.with_cp:
            return [torch_checkpoint.checkpoint_sequential(self.layers, 2, x)]
        return [self.layers(x)]


def _resnet(with_cp):
    return ResNet(depth=18, with_cp=with_cp, num_stages=2, **stages(2), **TINY)


def _hrnet(with_cp):
    from mmdet.models.backbones import HRNet
    from mmdet.models.necks import HRFPN

    def stage(branches, block):
        return dict(
            num_modules=1,
            num_branches=branches,
            block=block,
            num_blocks=(1, ) * branches,
            num_channels=tuple(4 * 2**i for i in range(branches)))

    extra = dict(
        stage1=stage(1, 'BOTTLENECK'),
        stage2=stage(2, 'BASIC'),
        stage3=stage(3, 'BASIC'),
        stage4=stage(4, 'BASIC'))
    return (HRNet(extra, with_cp=with_cp),
            HRFPN([4, 8, 16, 32], 8, num_outs=2, with_cp=with_cp))


# Checkpointed through MMEngine's `activation_checkpointing` setting: mmdet's
# PVT has no with_cp switch, so that setting is its way to checkpoint.
LISTED = {
    'pvt': ['backbone.layers.0.1.0', 'backbone.layers.1.1.0'],
    'mmengine_activation_checkpointing':
    ['backbone.layer1', 'backbone.layer2'],
}


def _build_case(case, with_cp):
    """(model, the config the hook sees) of one matrix case."""
    from mmdet.models import backbones
    from mmengine.runner import turn_on_activation_checkpointing
    neck = None
    if case in ('resnet', 'resnet_rank0_branch'):
        backbone = _resnet(with_cp)
    elif case == 'resnext':
        backbone = ResNeXt(
            depth=50,
            groups=2,
            base_width=4,
            with_cp=with_cp,
            num_stages=1,
            **stages(1),
            **TINY)
    elif case == 'regnet':
        backbone = backbones.RegNet(
            dict(w0=8, wa=16.0, wm=2.0, group_w=8, depth=2, bot_mul=1.0),
            with_cp=with_cp,
            **stages(2),
            **TINY)
    elif case == 'hrnet':
        backbone, neck = _hrnet(with_cp)
    elif case == 'swin':
        backbone = backbones.SwinTransformer(
            pretrain_img_size=32,
            embed_dims=8,
            depths=(1, 1),
            num_heads=(1, 1),
            strides=(4, 2),
            window_size=4,
            mlp_ratio=2,
            out_indices=(0, 1),
            drop_path_rate=0.,
            with_cp=with_cp)
    elif case == 'pvt':
        backbone = backbones.PyramidVisionTransformer(
            pretrain_img_size=32,
            embed_dims=8,
            num_stages=2,
            num_layers=[1, 1],
            num_heads=[1, 1],
            patch_sizes=[4, 2],
            strides=[4, 2],
            sr_ratios=[2, 1],
            mlp_ratios=[2, 2],
            out_indices=(0, 1),
            drop_path_rate=0.)
    elif case == 'checkpoint_sequential':
        backbone = SequentialStage(with_cp)
    elif case == 'checkpoint_sequential_on_rank_1':
        backbone = SequentialStage(with_cp and dist.get_rank() == 1)
    elif case == 'mmengine_activation_checkpointing':
        backbone = _resnet(with_cp=False)
    model = TinyDetector(backbone, neck)
    if case == 'resnet_rank0_branch':
        # Only rank0_scale differs: rank 0 completes the bucket and waits
        # in its backward for an all-reduce rank 1 never launches.
        del model.unused
    listed = LISTED.get(case, [])
    if with_cp and listed:
        turn_on_activation_checkpointing(model, listed)
    # Moved last, complete: BaseModel's data preprocessor learns its
    # device from the move.
    return on_rank_device(model), dict(activation_checkpointing=listed)


CASES = ('resnet', 'resnext', 'regnet', 'hrnet', 'swin', 'pvt',
         'checkpoint_sequential', 'mmengine_activation_checkpointing')


def _twin_grads(twin, model, batch):
    """Gradients of ``twin`` (the model without checkpointing) at
    ``model``'s current weights, averaged across ranks as DDP does."""
    twin.load_state_dict(model.state_dict())
    twin.zero_grad(set_to_none=True)
    twin(**batch)['loss'].backward()
    grads = {}
    for name, param in twin.named_parameters():
        grad = torch.zeros_like(param) if param.grad is None else param.grad
        dist.all_reduce(grad)
        grads[name] = grad / dist.get_world_size()
    return grads


def _relative_error(grads, expected) -> float:
    worst = 0.
    for name, grad in expected.items():
        actual = grads.get(name, torch.zeros_like(grad))
        scale = grad.abs().max().clamp_min(1e-12)
        worst = max(worst, float((actual - grad).abs().max() / scale))
    return worst


class AppliedInFirstStep:
    """AutoDDP as before issue 28: a stored decision is applied in its
    first ``train_step``, after every hook's ``before_train``."""

    def apply_resumed_decision(self):
        return False

    def train_step(self, *args, **kwargs):
        from mmddp_ext.wrappers import AutoDDP
        AutoDDP.apply_resumed_decision(self)
        return super().train_step(*args, **kwargs)


def _wrap(model, shape, group=None):
    from mmengine.logging import MessageHub
    from mmengine.model import MMDistributedDataParallel

    from mmddp_ext.wrappers import AutoDDP
    from mmddp_ext.wrappers.auto_ddp import DECISION_INFO_KEY
    if shape == 'autoddp':
        return AutoDDP(model)
    if shape.startswith('autoddp_resumed'):
        wrapper_cls = AutoDDP
        if shape == 'autoddp_resumed_in_first_step':
            wrapper_cls = type('AutoDDPAppliedInFirstStep',
                               (AppliedInFirstStep, AutoDDP), {})
        wrapper = wrapper_cls(model, process_group=group)
        # What Runner.resume loads from a checkpoint of a run that needed
        # find_unused_parameters=True.
        MessageHub.get_current_instance().update_info(
            DECISION_INFO_KEY,
            dict(
                mode='find_unused',
                find_unused_parameters=True,
                reason='stored'))
        return wrapper
    return MMDistributedDataParallel(
        model,
        find_unused_parameters=True,
        process_group=group)


def _train(case, shape, hook=None, steps=2, group=None):
    """Train ``case`` with checkpointing for ``steps``, calling the wrapper
    and the hook the way the Runner does. Returns, per step, the policy in
    force and the largest relative gradient error against the same model
    without checkpointing at the same weights."""
    from mmengine.optim import OptimWrapper
    torch.manual_seed(0)
    model, cfg = _build_case(case, with_cp=True)
    twin, _ = _build_case(case, with_cp=False)
    wrapper = _wrap(model, shape, group)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    runner = SimpleNamespace(model=wrapper, cfg=cfg)
    record = dict(policies=[], errors=[], wrapper=wrapper)
    # The gradients DDP leaves, just before the optimizer uses them.
    optim.optimizer.register_step_pre_hook(lambda *_: record['errors'].append(
        _relative_error(
            {
                n: p.grad
                for n, p in model.named_parameters() if p.grad is not None
            }, record['expected'])))
    if hook is not None:
        hook.before_train(runner)
    try:
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * dist.get_rank() + step)
            batch = dict(inputs=torch.randn(2, 3, 32, 32, generator=gen))
            record['expected'] = _twin_grads(twin, model, batch)
            record['policies'].append(act_cp.current_policy())
            wrapper.train_step(batch, optim)
            if hook is not None:
                hook.after_train_iter(runner, step)
    finally:
        if hook is not None:
            hook.after_run(runner)
    return record


def _without_hook(case, shape, hook=None):
    """The same run with no hook (or ``hook``): DDP's error text, or
    'trained'."""
    group = dist.new_group(backend='gloo')  # a failed run leaves it broken
    try:
        _train(case, shape, hook=hook, group=group)
    except RuntimeError as error:
        return str(error)
    return 'trained'


def _policy_outcomes():
    """'disable' and 'error' with both conflict shapes."""
    outcomes = {}
    for shape, case in (('autoddp', 'mmengine_activation_checkpointing'),
                        ('ddp', 'resnet')):
        for policy in ('disable', 'error'):
            hook = CheckpointConflictHook(policy=policy)
            try:
                record = _train(case, shape, hook)
                outcomes[shape, policy] = dict(
                    resolved=hook.resolved,
                    policies=record['policies'],
                    errors=record['errors'])
            except ValueError as error:
                outcomes[shape, policy] = str(error)
    return outcomes


def _under_the_default_policy(case, shape):
    """``case`` with the conflict ``shape`` under the default policy: the
    run's record, the sites the hook saw and resolved, AutoDDP's
    decision."""
    hook = CheckpointConflictHook()
    record = _train(case, shape, hook)
    wrapper = record.pop('wrapper')
    return dict(
        record,
        sites={n: sorted(s, key=str)
               for n, s in hook.sites.items()},
        resolved=hook.resolved,
        decision=(getattr(wrapper, 'autoddp_decision', None)
                  or {}).get('mode'))


def _seen_on_one_rank():
    """The sites every rank names when only rank 1 checkpoints."""
    hook = CheckpointConflictHook()
    _train('checkpoint_sequential_on_rank_1', 'autoddp', hook)
    return sorted(hook.sites)


def _resumed_applied_in_first_step(case):
    return _without_hook(case, 'autoddp_resumed_in_first_step',
                         CheckpointConflictHook())


def _matrix_run(name, fn, *args):
    """One run of ``MATRIX_RUNS`` on this rank."""
    return fn(*args)


def _run_name(case, what):
    return f'{case}, {what}'


# One case per checkpointing form the hook resolves: mmdet with_cp,
# `checkpoint` imported by name (HRFPN), checkpoint_sequential, MMEngine's
# activation_checkpointing.
RESUMED_CASES = ('resnet', 'hrnet', 'checkpoint_sequential',
                 'mmengine_activation_checkpointing')
EXPECTED_SITES = dict(
    resnet=[f'backbone.layer{i}.{j}' for i in (1, 2) for j in (0, 1)],
    resnext=[f'backbone.layer1.{j}' for j in range(3)],
    checkpoint_sequential=['backbone'],
    **LISTED)
SHAPES = ('autoddp', 'ddp')


# Every case under the default policy with both conflict shapes, the
# other policies, then the negative controls (their failed DDP runs go
# last, on side groups): (name, function, *its arguments).
MATRIX_RUNS = [(_run_name(case, shape), _under_the_default_policy, case,
                shape) for case in CASES for shape in SHAPES]
MATRIX_RUNS += [('policies', _policy_outcomes),
                ('seen on rank 1 only', _seen_on_one_rank)]
MATRIX_RUNS += [(_run_name(case, 'no hook'), _without_hook, case, 'ddp')
                for case in CASES]
MATRIX_RUNS += [(_run_name(case, 'resumed, applied in first step'),
                 _resumed_applied_in_first_step, case)
                for case in RESUMED_CASES]
# Each run's limit, checked in the ranks: measured 0.1-1.0 s at load 5 on 2
# cores (the first of a launch the longest: the ranks' warm-up).
MATRIX_RUN_LIMIT_S = 30
# The launch's limit: measured 11 s at load 5 (6-17 s for the test that
# starts it, at load 2-5).
MATRIX_LAUNCH_LIMIT_S = 240
# A test that reads the matrix may start its launch (the first to ask; a
# later one after a failed run; measured 6-17 s at load 2-5): the
# launch's limit, the launcher's limit for starting the ranks, its grace
# for a failed rank's peers and a margin for reporting: above setup.cfg's
# 300 s.
MATRIX_TEST_LIMIT_S = (MATRIX_LAUNCH_LIMIT_S + STARTUP_LIMIT_S +
                       FAILURE_GRACE_S + 20)


@pytest.fixture(scope='module')
def matrix(tmp_path_factory):
    """``MATRIX_RUNS`` on 2 ranks as their tests ask for them: one launch
    for all when all goes well; a run that fails or passes its limit fails
    only its own tests."""
    return RunsInOneLaunch(
        _matrix_run,
        MATRIX_RUNS,
        2,
        results_dir=str(tmp_path_factory.mktemp('checkpoint_matrix')),
        run_limit_s=MATRIX_RUN_LIMIT_S,
        launch_limit_s=MATRIX_LAUNCH_LIMIT_S,
        what='checkpoint matrix run')


def _resumed(cases):
    """A resumed AutoDDP whose stored decision needs
    find_unused_parameters=True, for each case: the hook's record."""
    results = {}
    for case in cases:
        hook = CheckpointConflictHook()
        record = _train(case, 'autoddp_resumed', hook)
        results[case] = dict(
            policies=record['policies'],
            errors=record['errors'],
            resolved=hook.resolved,
            decision=record['wrapper'].autoddp_decision['mode'])
    return results


@pytest.mark.parametrize('case', CASES)
@pytest.mark.timeout(MATRIX_TEST_LIMIT_S)
def test_backbone_matrix_trains_under_the_default_policy(matrix, case):
    for shape in SHAPES:
        for rank, out in enumerate(matrix.of(_run_name(case, shape))):
            where = (rank, case, shape, out)
            assert len(out['errors']) == 2, where
            assert out['sites'], where
            assert sorted(out['resolved']) == sorted(out['sites']), where
            if case in EXPECTED_SITES:
                assert sorted(out['sites']) == EXPECTED_SITES[case], where
            # AutoDDP probes without DDP (torch's reentrant default, a
            # different summation order), then needs find_unused.
            assert out['policies'] == ([
                None, 'non_reentrant'
            ] if shape == 'autoddp' else ['non_reentrant'] * 2), where
            for policy, error in zip(out['policies'], out['errors']):
                assert error <= (1e-6 if policy else 1e-5), where
            if shape == 'autoddp':
                assert out['decision'] == 'find_unused', where
    for rank, out in enumerate(matrix.of(_run_name(case, 'ddp'))):
        if case == 'hrnet':
            # HRFPN: `from ... import checkpoint`
            assert 'neck' in out['sites'], rank
            assert any(s.startswith('backbone.') for s in out['sites']), rank
        if case == 'checkpoint_sequential':
            # the user's call states nothing; torch's inner call gets False
            assert out['sites'] == {'backbone': [False, None]}, rank


# Its own launch (timeout=120 below), and the matrix's when it is the first
# to ask for the matrix's last runs.
@pytest.mark.timeout(MATRIX_TEST_LIMIT_S + 120 + STARTUP_LIMIT_S +
                     FAILURE_GRACE_S)
def test_resumed_decision_is_resolved_before_the_first_step(matrix):
    """Issue 28, case 2: the resumed run's DDP (find_unused_parameters=True
    from the stored decision) is built before the hook's before_train, so
    the policy applies from the first step, for every checkpointing form.
    Negative control (the matrix spawn): applied in the first train_step,
    after the hook deferred its check, each fails with DDP's error."""
    results = run_on_ranks(_resumed, 2, args=(RESUMED_CASES, ), timeout=120)
    for rank, result in enumerate(results):
        for case in RESUMED_CASES:
            out = result[case]
            where = (rank, case, out)
            assert out['decision'] == 'resumed', where
            assert out['policies'] == ['non_reentrant'] * 2, where
            assert max(out['errors']) <= 1e-6, where
            assert out['resolved'], where
            if case in EXPECTED_SITES:
                assert sorted(out['resolved']) == EXPECTED_SITES[case], where
            assert DDP_DOUBLE_READY in matrix.of(
                _run_name(case, 'resumed, applied in first step'))[rank], where


@pytest.mark.timeout(MATRIX_TEST_LIMIT_S)
def test_every_rank_names_the_sites_seen_on_any_rank(matrix):
    assert matrix.of('seen on rank 1 only') == [['backbone'], ['backbone']]


@pytest.mark.parametrize('case', CASES)
@pytest.mark.timeout(MATRIX_TEST_LIMIT_S)
def test_same_runs_without_the_hook_fail_with_the_ddp_error(matrix, case):
    for rank, error in enumerate(matrix.of(_run_name(case, 'no hook'))):
        assert DDP_DOUBLE_READY in error, (rank, case)


def _divergent_ranks():
    """Two steps of plain DDP without find_unused_parameters, with the
    hook called as the Runner calls it (and no other collective): the
    model's ``rank0_scale`` gets a gradient on rank 0 only."""
    from mmengine.model import MMDistributedDataParallel
    from mmengine.optim import OptimWrapper
    torch.manual_seed(0)
    model, cfg = _build_case('resnet_rank0_branch', with_cp=True)
    wrapper = MMDistributedDataParallel(model)
    optim = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    runner = SimpleNamespace(model=wrapper, cfg=cfg)
    hook = CheckpointConflictHook()
    hook.before_train(runner)
    for step in range(2):
        wrapper.train_step(
            dict(inputs=torch.randn(2, 3, 32, 32)), optim)
        hook.after_train_iter(runner, step)


def test_divergent_ranks_still_get_the_ddp_error_with_the_hook():
    """The hook merges the ranks' sites inside the first forward, before
    DDP's backward: rank 1 gets DDP's own error at step 2, as without the
    hook, while rank 0 waits in step 1's backward for a bucket all-reduce
    rank 1 never launched. (The merge used to run after the step, where
    rank 1 waited for rank 0: both hung until the timeout.)"""
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(_divergent_ranks, 2, timeout=60)  # 3x its loaded time
    assert ('===== rank 1: RuntimeError: Expected to have finished '
            'reduction in the prior iteration') in str(info.value)


@pytest.mark.timeout(MATRIX_TEST_LIMIT_S)
def test_disable_and_error_policies_on_real_ddp(matrix):
    for rank, out in enumerate(matrix.of('policies')):
        for shape in SHAPES:
            assert max(out[shape, 'disable']['errors']) <= 1e-6, (rank, out)
        assert out['ddp', 'disable']['policies'] == ['disable'] * 2, rank
        assert out['autoddp', 'disable']['resolved'] == LISTED[
            'mmengine_activation_checkpointing'], rank
        # plain DDP: refused at the first checkpoint call, before backward
        assert 'in 1 module(s): backbone.layer1.0. Set ' \
            'model.backbone.with_cp=False, or use' in out['ddp', 'error'], rank
        # AutoDDP: refused after the probe step, naming MMEngine's key
        assert ("in 2 module(s): backbone.layer1, backbone.layer2. Set "
                "activation_checkpointing without 'backbone.layer1', "
                "activation_checkpointing without 'backbone.layer2'"
                ) in out['autoddp', 'error'], rank


# ------------------------------------------------------- full Runner run
EXTENDED = {
    'model.backbone.with_cp': True,
    'model.bbox_head.type': 'DINOHeadRankZeroBranch',
    'model_wrapper_cfg': dict(type='AutoDDP'),
}


def _train_runner(work_dir, data_root, overrides):
    from ..test_wrappers import ddp_probe_heads  # noqa: F401
    runner = build_runner(work_dir, data_root, 3, overrides)
    runner.train()
    return runner.model.find_unused_parameters


def test_with_cp_and_extended_head_train_with_the_hook(tmp_path,
                                                       synthetic_root):
    work_dir = str(tmp_path / 'hook')
    overrides = dict(
        EXTENDED, custom_hooks=[dict(type='CheckpointConflictHook')])
    results = run_on_ranks(
        _train_runner,
        2,
        args=(work_dir, synthetic_root, overrides),
        timeout=150)
    assert results == [True, True]  # AutoDDP needed find_unused
    log = rank0_log(work_dir)
    assert ('made checkpointing non-reentrant in 8 module(s): '
            'backbone.layer1.0') in log
