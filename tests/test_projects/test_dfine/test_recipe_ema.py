"""``ModelEMA`` + ``ModelEMAHook`` average the model as upstream D-FINE /
DEIM's ``ModelEMA`` does.

Expected values: ``ema_traces`` of ``../test_deim/data/upstream_recipes.json``,
upstream's own ``ModelEMA`` (each repository's ``optim/ema.py``) updated
from a toy module whose weights follow a fixed sequence.
"""
import math

import numpy as np
import pytest
import torch
import torch.nn as nn
from mmdet.models.layers import ExpMomentumEMA
from mmdet.registry import MODELS
from mmengine.hooks import EMAHook, Hook
from mmengine.model import BaseModel
from torch.utils.data import Dataset

from mmddp_ext.runner import ExtRunner
from ..test_deim import upstream_recipes as upstream
from .dfine_utils import import_project


def toy_module() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))


def set_weights(module: nn.Module, toy: dict, step: int) -> None:
    """The recorded sequence: entry ``i`` of the state dict is
    ``base + i + step * slope`` (integer buffers untouched)."""
    with torch.no_grad():
        for index, value in enumerate(module.state_dict().values()):
            if value.dtype.is_floating_point:
                value.fill_(toy['base'] + index + step * toy['slope'])


def traces():
    for name in (upstream.DFINE, upstream.DEIM):
        for trace in upstream.repository(name)['ema_traces']:
            yield pytest.param(trace, id=f"{name}-{trace['warmups']}")


def run_toy(ema_type, trace: dict):
    toy = toy_module()
    set_weights(toy, trace['toy'], 0)
    ema = MODELS.build(
        dict(
            type=ema_type,
            _scope_='mmdet',
            model=toy,
            **ema_kwargs(ema_type, trace)))
    states = []
    for step in range(1, trace['toy']['steps'] + 1):
        set_weights(toy, trace['toy'], step)
        ema.update_parameters(toy)
        states.append({
            k: v.tolist()
            for k, v in ema.module.state_dict().items()
        })
    return states


def ema_kwargs(ema_type, trace: dict) -> dict:
    if ema_type == 'ModelEMA':
        return dict(decay=trace['decay'], warmups=trace['warmups'])
    return dict(
        momentum=1 - trace['decay'],
        gamma=trace['warmups'],
        update_buffers=True)


@pytest.mark.parametrize('trace', traces())
def test_model_ema_equals_upstream(trace):
    import_project()
    states = run_toy('ModelEMA', trace)
    for got, want in zip(states, trace['states']):
        assert set(got) == set(want)
        for key in want:
            assert np.allclose(got[key], want[key], rtol=1e-6, atol=0), key


@pytest.mark.parametrize('trace', traces())
def test_update_decays_equal_upstream(trace):
    """The decay of update ``u`` (``1 - ExpMomentumEMA``'s momentum at
    ``steps = u - 1``, the value every update after the first uses) equals
    upstream's ``decay_fn(u)`` at every recorded ``u``."""
    import_project()
    ema = MODELS.build(
        dict(
            type='ModelEMA',
            _scope_='mmdet',
            model=toy_module(),
            decay=trace['decay'],
            warmups=trace['warmups']))
    for update, decay in trace['decays'].items():
        momentum = (1 - ema.momentum) * math.exp(
            -float(int(update)) / ema.gamma) + ema.momentum
        assert 1 - momentum == pytest.approx(decay, rel=1e-12), update


@pytest.mark.parametrize('trace', traces())
def test_mmdet_exp_momentum_ema_copies_at_first_update(trace):
    """Negative control: mmdet's ``ExpMomentumEMA`` with the same decay and
    warm-up copies the model at its first update, so its average differs
    from upstream's by upstream's small share of the starting weights."""
    states = run_toy(ExpMomentumEMA, trace)
    first = trace['states'][0]
    assert any(not np.allclose(states[0][k], first[k], rtol=1e-6, atol=0)
               for k in first)


class ToyDataset(Dataset):

    def __len__(self):
        return 8

    def __getitem__(self, index):
        return dict(inputs=torch.tensor([float(index), 1.0]))


class ToyModel(BaseModel):
    """Its ``init_weights`` sets every weight to 0.5, so the model that
    training starts from differs from the one built (random)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)
        self.bn = nn.BatchNorm1d(1)

    def init_weights(self):
        nn.init.constant_(self.linear.weight, 0.5)
        nn.init.constant_(self.linear.bias, 0.5)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.bn(self.linear(torch.stack(inputs)))
        return dict(loss=(out - 1).pow(2).mean())


class Recorder(Hook):
    """Records the model at the start and the average after every
    iteration (runs after the EMA hook)."""
    priority = 'LOWEST'

    def __init__(self):
        self.start = None
        self.after = []

    def before_train(self, runner):
        model = runner.model
        self.start = {k: v.clone() for k, v in model.state_dict().items()}
        self.ema_at_start = self._ema(runner)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.after.append(({
            k: v.clone()
            for k, v in runner.model.state_dict().items()
        }, self._ema(runner)))

    @staticmethod
    def _ema(runner):
        hook = next(h for h in runner.hooks if isinstance(h, EMAHook))
        return ({
            k: v.clone()
            for k, v in hook.ema_model.module.state_dict().items()
        }, int(hook.ema_model.steps))


def train(work_dir, hook_cfg, iters=3, resume=None, ckpt_every=2):
    recorder = Recorder()
    runner = ExtRunner(
        model=ToyModel(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=ToyDataset(),
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=2,
            num_workers=0),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1)),
        train_cfg=dict(by_epoch=False, max_iters=iters),
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook', interval=ckpt_every, by_epoch=False)),
        custom_hooks=[hook_cfg, recorder],
        load_from=resume,
        resume=resume is not None,
        default_scope='mmdet',
        experiment_name=f'ema_{work_dir.name}_{iters}')
    runner.train()
    return recorder


EMA = dict(decay=0.9999, warmups=1000)


def first_update_expected(recorder):
    """Upstream's first update: ``d1 * start + (1 - d1) * model``."""
    d1 = EMA['decay'] * (1 - math.exp(-1 / EMA['warmups']))
    model, _ = recorder.after[0]
    return {
        k: d1 * recorder.start[k] + (1 - d1) * model[k]
        for k in model if model[k].dtype.is_floating_point
    }


def test_ema_hook_starts_from_the_initialised_model(tmp_path):
    """The average starts from the model training starts from (after
    ``init_weights``), and the first update keeps ``d1`` of it."""
    import_project()
    recorder = train(tmp_path, dict(type='ModelEMAHook', **EMA))
    ema_start, steps = recorder.ema_at_start
    assert steps == 0
    for key, value in recorder.start.items():
        assert torch.equal(ema_start[key], value), key
    ema_after, steps = recorder.after[0][1]
    assert steps == 1
    for key, want in first_update_expected(recorder).items():
        assert torch.allclose(ema_after[key], want, rtol=0, atol=1e-7), key


def test_plain_ema_hook_starts_from_the_model_before_init(tmp_path):
    """Negative control: MMEngine's ``EMAHook`` copies the model before
    ``Runner`` initialises it, so with ``ModelEMA`` (which averages at the
    first update, as upstream) the average keeps part of the random
    weights the model was built with."""
    import_project()
    recorder = train(tmp_path,
                     dict(type='EMAHook', ema_type='ModelEMA', **EMA))
    ema_after, _ = recorder.after[0][1]
    expected = first_update_expected(recorder)
    assert not torch.allclose(
        ema_after['linear.weight'], expected['linear.weight'], atol=1e-7)


def _copy_always_hook():
    """``ModelEMAHook`` with its ``steps == 0`` check switched off,
    registered under a test name."""
    from mmengine.registry import HOOKS
    dfine = import_project()
    name = 'CopyAlwaysEMAHookForTest'
    if HOOKS.get(name) is None:

        class CopyAlways(dfine.ModelEMAHook):

            def before_train(self, runner):
                EMAHook.before_train(self, runner)
                self.ema_model.module.load_state_dict(
                    self.src_model.state_dict())

        HOOKS.register_module(name=name, module=CopyAlways)
    return name


def test_resume_keeps_the_average(tmp_path):
    """A run resumed from a checkpoint continues with the saved average
    (weights, buffers and update count), not a copy of the model; the
    negative control copies the model at the start (the ``steps`` check
    off) and loses it."""
    import_project()
    first = tmp_path / 'first'
    first.mkdir()
    train(first, dict(type='ModelEMAHook', **EMA), iters=2)
    checkpoint = str(first / 'iter_2.pth')
    saved = torch.load(checkpoint, map_location='cpu', weights_only=False)
    # EMAHook saves the average as the state dict (deployable weights)
    saved_ema = saved['state_dict']
    saved_steps = int(saved['ema_state_dict']['steps'])
    saved_model = {
        k[len('module.'):]: v
        for k, v in saved['ema_state_dict'].items() if k.startswith('module.')
    }
    assert saved_steps == 2

    resumed = tmp_path / 'resumed'
    resumed.mkdir()
    recorder = train(
        resumed, dict(type='ModelEMAHook', **EMA), iters=3, resume=checkpoint)
    ema_start, steps = recorder.ema_at_start
    assert steps == saved_steps
    for key, value in saved_ema.items():
        assert torch.equal(ema_start[key], value), key
    assert not torch.equal(ema_start['linear.weight'],
                           saved_model['linear.weight'])

    control = tmp_path / 'control'
    control.mkdir()
    recorder = train(
        control,
        dict(type=_copy_always_hook(), **EMA),
        iters=3,
        resume=checkpoint)
    ema_start, _ = recorder.ema_at_start
    assert torch.equal(ema_start['linear.weight'],
                       saved_model['linear.weight'])
    assert not torch.equal(ema_start['linear.weight'],
                           saved_ema['linear.weight'])


def test_model_ema_checks_its_config():
    import_project()
    with pytest.raises(ValueError, match='warmups'):
        MODELS.build(
            dict(
                type='ModelEMA',
                _scope_='mmdet',
                model=toy_module(),
                decay=1.5))
