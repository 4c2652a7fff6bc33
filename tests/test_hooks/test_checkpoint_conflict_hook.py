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
from mmddp_ext.testing import MultiRankError, run_on_ranks
from mmddp_ext.utils import activation_checkpoint as act_cp

from ..helpers import build_runner, rank0_log

DDP_DOUBLE_READY = 'Expected to mark a variable ready only once'
TINY = dict(base_channels=8, stem_channels=8)


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
        depth=50,
        num_stages=2,
        out_indices=(0, 1),
        groups=2,
        base_width=4,
        **TINY)
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
    return ResNet(
        depth=18, num_stages=2, out_indices=(0, 1), with_cp=with_cp, **TINY)


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


def _build_case(case, with_cp):
    """(model, activation_checkpointing cfg) of one matrix case."""
    from mmdet.models import backbones
    if case == 'resnet':
        backbone, neck = _resnet(with_cp), None
    elif case == 'resnext':
        backbone = ResNeXt(
            depth=50,
            num_stages=1,
            out_indices=(0, ),
            groups=2,
            base_width=4,
            with_cp=with_cp,
            **TINY)
    elif case == 'regnet':
        backbone = backbones.RegNet(
            dict(w0=8, wa=8.0, wm=2.0, group_w=8, depth=3, bot_mul=1.0),
            stem_channels=8,
            base_channels=8,
            out_indices=(0, ),
            with_cp=with_cp)
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
            drop_path_rate=0.,
            with_cp=with_cp)
    elif case == 'checkpoint_sequential':
        backbone = SequentialStage(with_cp)
    if case not in ('resnet', 'hrnet'):
        neck = None
    model = TinyDetector(backbone, neck)
    listed = ['backbone.layer1', 'backbone.layer2']
    if case == 'mmengine_activation_checkpointing':
        model = TinyDetector(_resnet(with_cp=False))
        if with_cp:
            from mmengine.runner import turn_on_activation_checkpointing
            turn_on_activation_checkpointing(model, listed)
    return model, dict(activation_checkpointing=listed)


CASES = ('resnet', 'resnext', 'regnet', 'hrnet', 'swin', 'pvt',
         'checkpoint_sequential', 'mmengine_activation_checkpointing')


class GradRecorder:
    """An OptimWrapper that keeps each step's gradients before it steps."""

    def __new__(cls, model):
        from mmengine.optim import OptimWrapper

        class Recording(OptimWrapper):

            def step(self, **kwargs):
                self.grads.append({
                    n: p.grad.clone()
                    for n, p in model.named_parameters() if p.grad is not None
                })
                super().step(**kwargs)

        wrapper = Recording(torch.optim.SGD(model.parameters(), lr=0.1))
        wrapper.grads = []
        return wrapper


def _wrap(model, shape, group=None):
    from mmengine.model import MMDistributedDataParallel

    from mmddp_ext.wrappers import AutoDDP
    if shape == 'autoddp':
        return AutoDDP(model)
    return MMDistributedDataParallel(
        model, find_unused_parameters=True, process_group=group)


def _train(case, with_cp, shape, hook=None, steps=2, group=None):
    """Train ``case`` for ``steps`` the way the Runner calls the wrapper and
    the hook; returns the gradients and the policy in force at each step."""
    torch.manual_seed(0)
    model, cfg = _build_case(case, with_cp)
    wrapper = _wrap(model, shape, group)
    optim = GradRecorder(model)
    runner = SimpleNamespace(model=wrapper, cfg=cfg)
    policies = []
    if hook is not None:
        hook.before_train(runner)
    try:
        for step in range(steps):
            gen = torch.Generator().manual_seed(100 * dist.get_rank() + step)
            batch = dict(inputs=torch.randn(2, 3, 32, 32, generator=gen))
            policies.append(act_cp.current_policy())
            wrapper.train_step(batch, optim)
            if hook is not None:
                hook.after_train_iter(runner, step)
    finally:
        if hook is not None:
            hook.after_run(runner)
    return optim.grads, policies, wrapper


def _relative_error(actual, expected) -> float:
    worst = 0.
    for step_actual, step_expected in zip(actual, expected):
        for name in step_actual.keys() | step_expected.keys():
            grad = step_expected.get(name)
            other = step_actual.get(name)
            grad = torch.zeros_like(other) if grad is None else grad
            other = torch.zeros_like(grad) if other is None else other
            scale = grad.abs().max().clamp_min(1e-12)
            worst = max(worst, float((other - grad).abs().max() / scale))
    return worst


def _without_hook(case, shape):
    """The same run with no hook: DDP's error text, or 'trained'."""
    group = dist.new_group(backend='gloo')  # a failed run leaves it broken
    try:
        _train(case, True, shape, steps=2, group=group)
    except RuntimeError as error:
        return str(error)
    return 'trained'


def _matrix(cases, shapes):
    """On each rank: every case under the default policy with both
    conflict shapes, compared with a no-checkpointing run; then the
    negative controls (their failed DDP runs go last, on side groups)."""
    results = {}
    for case in cases:
        reference, _, _ = _train(case, False, 'ddp')
        for shape in shapes:
            hook = CheckpointConflictHook()
            grads, policies, wrapper = _train(case, True, shape, hook)
            results[case, shape] = dict(
                sites={
                    n: sorted(s, key=str)
                    for n, s in hook.sites.items()
                },
                resolved=hook.resolved,
                policies=policies,
                decision=(wrapper.autoddp_decision or {}).get('mode'),
                error=_relative_error(grads, reference),
                steps=len(grads))
    for case in cases:
        results[case, 'no hook'] = _without_hook(case, 'ddp')
    return results


EXPECTED_SITES = {
    'resnet': [
        'backbone.layer1.0', 'backbone.layer1.1', 'backbone.layer2.0',
        'backbone.layer2.1'
    ],
    'resnext': ['backbone.layer1.0', 'backbone.layer1.1', 'backbone.layer1.2'],
    'checkpoint_sequential': ['backbone'],
    'mmengine_activation_checkpointing':
    ['backbone.layer1', 'backbone.layer2'],
}


def test_backbone_matrix_trains_with_the_hook_and_fails_without():
    shapes = ('autoddp', 'ddp')
    results = run_on_ranks(_matrix, 2, args=(CASES, shapes), timeout=180)
    for rank, result in enumerate(results):
        for case in CASES:
            for shape in shapes:
                out = result[case, shape]
                where = (rank, case, shape, out)
                assert out['steps'] == 2, where
                assert out['sites'], where
                assert sorted(out['resolved']) == sorted(out['sites']), where
                if case in EXPECTED_SITES:
                    assert sorted(out['sites']) == EXPECTED_SITES[case], where
                assert out['error'] <= 1e-6, where
                # AutoDDP probes without DDP, then needs find_unused.
                assert out['policies'] == ([
                    None, 'non_reentrant'
                ] if shape == 'autoddp' else ['non_reentrant'] * 2), where
                if shape == 'autoddp':
                    assert out['decision'] == 'find_unused', where
            assert DDP_DOUBLE_READY in result[case, 'no hook'], (rank, case)
        hrnet_sites = result['hrnet', 'ddp']['sites']
        assert 'neck' in hrnet_sites  # HRFPN: `from ... import checkpoint`
        assert any(s.startswith('backbone.') for s in hrnet_sites)
        # the user's call states nothing; torch's inner call gets False
        assert result['checkpoint_sequential', 'ddp']['sites'] == {
            'backbone': [False, None]
        }


# ---------------------------------------------------------------- policies
def _policy_outcomes():
    """On each rank: 'disable' and 'error' with both conflict shapes."""
    outcomes = {}
    for shape in ('autoddp', 'ddp'):
        for policy in ('disable', 'error'):
            hook = CheckpointConflictHook(policy=policy)
            try:
                grads, policies, _ = _train(
                    'mmengine_activation_checkpointing'
                    if shape == 'autoddp' else 'resnet', True, shape, hook)
                outcomes[shape, policy] = dict(
                    resolved=hook.resolved, policies=policies)
            except ValueError as error:
                outcomes[shape, policy] = str(error)
    return outcomes


def test_disable_and_error_policies_on_real_ddp():
    for rank, out in enumerate(run_on_ranks(_policy_outcomes, 2, timeout=90)):
        assert out['ddp', 'disable']['policies'] == ['disable'] * 2, rank
        assert out['autoddp', 'disable']['resolved'] == [
            'backbone.layer1', 'backbone.layer2'
        ], rank
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
