"""NonFiniteSkipHook under AMP on 2 real gloo ranks: the scaler's own
skips while the scale settles are not the hook's (they never stop
training), a non-finite loss on one rank is skipped once, by the hook, on
every rank, and the scale backs off once, alike on every rank."""
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub
from mmengine.model import BaseModel

from mmddp_ext.hooks import NonFiniteSkipHook
from mmddp_ext.optim import ExtAmpOptimWrapper
from mmddp_ext.testing import run_on_ranks

# Overflowing float16 gradients (FACTOR * 2 rows * scale above 65504)
# until the scale is 32: 11 scaler skips.
FACTOR = 1e3
SETTLE = 11
NAN_ITER = 14  # 0-based iteration whose loss is NaN on rank 1


class ScaledLoss(BaseModel):
    """``FACTOR * sum(linear(x))``; NaN on rank 1 in iteration
    ``nan_iter``."""

    def __init__(self, nan_iter: int):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.nan_iter = nan_iter
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss'):
        loss = self.linear(inputs).float().sum() * FACTOR
        if dist.get_rank() == 1 and self.calls == self.nan_iter:
            loss = loss * float('nan')
        self.calls += 1
        return dict(loss=loss)


def _train(nan_iter: int, iters: int, coordinated: bool) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    from mmddp_ext.hooks.nonfinite_skip_hook import NonFiniteLossError
    torch.manual_seed(0)
    model = ScaledLoss(nan_iter)
    device = next(model.parameters()).device
    wrapper = ExtAmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=1e-6),
        device=device.type)
    ddp = DDP(model, device_ids=None if device.type == 'cpu' else [device])
    hub = MessageHub.get_instance(f'amp_skip_{time.time()}')
    wrapper.message_hub = hub
    runner = SimpleNamespace(
        model=ddp, optim_wrapper=wrapper, message_hub=hub, iter=0)
    hook = NonFiniteSkipHook(max_consecutive_skips=2)
    if not coordinated:  # the control: a skip the scaler never hears of
        wrapper.back_off = lambda: None
    hook.before_train(runner)
    scales, error = [], None
    x = torch.ones(2, 4, device=device)
    for i in range(iters):
        hook.before_train_iter(runner, i)
        try:
            with wrapper.optim_context(ddp):
                losses = ddp(x)
            loss, _ = model.parse_losses(losses)
            wrapper.update_params(loss)
        except NonFiniteLossError as exc:
            error = str(exc)
            break
        hook.after_train_iter(runner, i)
        runner.iter += 1
        scales.append(wrapper.loss_scaler.get_scale())
    hook.after_train(runner)
    return dict(
        scales=scales,
        error=error,
        hook_skips=hook.total_skips,
        scaler_skips=wrapper.scaler_skipped_steps,
        weight=model.linear.weight.detach().cpu())


def _both() -> dict:
    """The coordinated run and the control, in one launch."""
    return dict(
        coordinated=_train(NAN_ITER, 18, True),
        control=_train(NAN_ITER, 16, False))


@pytest.fixture(scope='module')
def runs():
    return run_on_ranks(_both, 2, timeout=90)


def test_scaler_skips_and_a_nonfinite_loss_are_skipped_once_on_every_rank(
        runs):
    ranks = [run['coordinated'] for run in runs]
    for result in ranks:
        assert result['error'] is None  # 11 scaler skips, limit 2: kept on
        assert result['hook_skips'] == 1
        # the NaN step backs off once, by the hook, not counted again
        assert result['scaler_skips'] == SETTLE
        scales = result['scales']
        assert scales[SETTLE - 1] == 32.0
        assert scales[NAN_ITER - 1] == 32.0 and scales[NAN_ITER] == 16.0
        assert scales[-1] == 16.0
    assert ranks[0]['scales'] == ranks[1]['scales']
    torch.testing.assert_close(ranks[0]['weight'], ranks[1]['weight'])


def test_control_without_the_back_off_the_scale_ignores_the_nan_step(runs):
    """Without the coordination the skipped NaN step leaves the scale where
    it was, unlike AMP without the hook (the scaler sees the NaN
    gradients and halves it)."""
    for run in runs:
        assert run['control']['hook_skips'] == 1
        assert run['control']['scales'][NAN_ITER] == 32.0
