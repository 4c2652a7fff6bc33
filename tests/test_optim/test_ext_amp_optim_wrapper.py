"""ExtAmpOptimWrapper: mixed precision on CPU (and CUDA) ranks, the loss
scale and the scaler's skipped steps in the log, and which precision an
``optim_wrapper`` config trains in (``resolve_precision``)."""
import math

import pytest
import torch
import torch.nn as nn
from mmengine.config import ConfigDict
from mmengine.logging import MessageHub

from mmddp_ext.optim import ExtAmpOptimWrapper
from mmddp_ext.optim.ext_amp_optim_wrapper import (LOSS_SCALE_SCALAR,
                                                   SCALER_SKIPS_SCALAR)
from mmddp_ext.utils.precision import resolve_precision

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'


def _wrapper(model, **kwargs):
    MessageHub.get_instance(f'amp_{id(model)}')
    return ExtAmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
        device=DEVICE,
        **kwargs)


@pytest.mark.parametrize('dtype, expected', [(None, torch.float16),
                                             ('bfloat16', torch.bfloat16)])
def test_autocast_and_scaler_on_the_training_device(dtype, expected):
    model = nn.Linear(4, 2).to(DEVICE)
    wrapper = _wrapper(model, dtype=dtype)
    with wrapper.optim_context(model):
        out = model(torch.ones(3, 4, device=DEVICE))
    assert out.dtype == expected
    assert model.weight.dtype == torch.float32  # master weights
    assert isinstance(wrapper.loss_scaler, torch.amp.GradScaler)
    assert wrapper.loss_scaler.get_scale() == 65536.0


def test_control_mmengines_autocast_refuses_float16_on_the_cpu():
    """Why ExtAmpOptimWrapper enters torch.autocast itself: MMEngine's
    ``autocast`` (what ``AmpOptimWrapper.optim_context`` uses) accepts
    only bfloat16 on the CPU, and ``AmpOptimWrapper.__init__`` refuses a
    machine without an accelerator."""
    from mmengine.runner.amp import autocast
    with pytest.raises(AssertionError, match='only support .*bfloat16'):
        with autocast(device_type='cpu', dtype=torch.float16):
            pass


class _Overflowing(nn.Module):
    """A loss whose float16 gradient overflows until the scale is below
    ``65504 / factor``."""

    def __init__(self, factor: float):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.factor = factor

    def forward(self, x):
        return self.linear(x).float().sum() * self.factor


def test_scale_settles_skipped_steps_are_counted_and_kept_out_of_the_log():
    torch.manual_seed(0)
    model = _Overflowing(factor=1e3).to(DEVICE)
    wrapper = _wrapper(model, clip_grad=dict(max_norm=1e6))
    x = torch.ones(2, 4, device=DEVICE)
    history, skipped = [], []
    for _ in range(16):
        before = model.linear.weight.detach().clone()
        with wrapper.optim_context(model):
            loss = model(x)
        wrapper.update_params(loss)
        skipped.append(torch.equal(before, model.linear.weight.detach()))
        history.append(wrapper.loss_scaler.get_scale())
    # The float16 weight gradient, factor * 2 rows * scale, overflows
    # (above 65504) until the halved scale is 32: 65536 / 32 = 2**11.
    settled = 2**math.floor(math.log2(65504 / (1e3 * 2)))
    first_step = skipped.index(False)
    assert first_step == math.log2(65536 / settled) == 11
    assert all(skipped[:first_step]) and not any(skipped[first_step:])
    assert history[first_step] == settled
    assert wrapper.scaler_skipped_steps == first_step
    hub = wrapper.message_hub
    assert hub.get_scalar(SCALER_SKIPS_SCALAR).current() == first_step
    assert hub.get_scalar(LOSS_SCALE_SCALAR).current() == history[-1]
    norms = hub.get_scalar('train/grad_norm').data[0]
    assert len(norms) == 16 - first_step
    assert all(math.isfinite(n) for n in norms)


def test_back_off_and_resume_keep_the_scale():
    model = nn.Linear(4, 1).to(DEVICE)
    wrapper = _wrapper(model)
    wrapper.back_off()
    state = wrapper.loss_scaler.state_dict()
    assert state['scale'] == 32768.0 and state['_growth_tracker'] == 0
    resumed = _wrapper(model)
    resumed.load_state_dict(wrapper.state_dict())
    assert resumed.loss_scaler.get_scale() == 32768.0
    static = _wrapper(model, loss_scale=512.0)
    static.back_off()
    assert static.loss_scaler.get_scale() == 512.0


@pytest.mark.parametrize('kwargs, error, words', [
    (dict(dtype='float32'), ValueError, "dtype must be one of .*'float32'"),
    (dict(loss_scale='auto'), TypeError, "loss_scale must be .*'auto'"),
    (dict(device='mps'), ValueError, "device must be one of .*'mps'"),
])
def test_bad_arguments_name_the_fix(kwargs, error, words):
    model = nn.Linear(4, 1)
    args = dict(dict(device='cpu'), **kwargs)
    with pytest.raises(error, match=words):
        ExtAmpOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1), **args)


AMP_CFG = ConfigDict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    optimizer=dict(type='AdamW', lr=1e-4),
    clip_grad=dict(max_norm=0.1))


@pytest.mark.parametrize('device', ['cpu', 'cuda'])
def test_amp_configs_build_ext_amp_on_cpu_and_cuda(device):
    precision = resolve_precision(AMP_CFG, device)
    assert precision.amp and precision.dtype == 'float16'
    assert precision.optim_wrapper == dict(AMP_CFG, type='ExtAmpOptimWrapper')
    assert AMP_CFG.type == 'AmpOptimWrapper'  # a copy changed
    assert 'float16 autocast' in precision.describe()


def test_cpu_amp_false_trains_cpu_ranks_in_float32():
    precision = resolve_precision(AMP_CFG, 'cpu', cpu_amp=False)
    assert not precision.amp
    assert precision.optim_wrapper == dict(
        type='OptimWrapper',
        optimizer=dict(type='AdamW', lr=1e-4),
        clip_grad=dict(max_norm=0.1))
    assert 'cpu_amp=False' in precision.describe()
    assert resolve_precision(AMP_CFG, 'cuda', cpu_amp=False).amp
    with pytest.raises(TypeError, match="cpu_amp must be .* got 'no'"):
        resolve_precision(AMP_CFG, 'cpu', cpu_amp='no')


def test_other_wrappers_and_dtypes_run_as_written():
    plain = ConfigDict(type='OptimWrapper', optimizer=dict(type='SGD'))
    assert resolve_precision(plain, 'cpu').optim_wrapper is plain
    assert resolve_precision(plain, 'cpu').reason == ''
    fp32 = ConfigDict(AMP_CFG, dtype='float32')
    assert resolve_precision(fp32, 'cuda').optim_wrapper is fp32
    on_cpu = resolve_precision(fp32, 'cpu')
    assert not on_cpu.amp and on_cpu.optim_wrapper.type == 'OptimWrapper'
