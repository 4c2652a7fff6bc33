"""A coordinated non-finite skip restores the offending rank's buffers
(BatchNorm running statistics) from a healthy rank (issue 14, case 8), on
2 real gloo ranks with DDP and ``broadcast_buffers=False``."""
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub
from mmengine.model import BaseModel, MMDistributedDataParallel
from mmengine.optim import OptimWrapper

from mmddp_ext.hooks import NonFiniteSkipHook
from mmddp_ext.testing import on_rank_device, run_on_ranks

NAN_RANK, NAN_CALL = 1, 2


class TinyBNModel(BaseModel):
    """Linear + BatchNorm; rank ``NAN_RANK``'s input is NaN in its forward
    call ``NAN_CALL``, which makes its loss and running statistics NaN."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss'):
        self.calls += 1
        if dist.get_rank() == NAN_RANK and self.calls == NAN_CALL:
            inputs = inputs * float('nan')
        return dict(loss=self.bn(self.linear(inputs)).pow(2).mean())


class NoBufferRestore(NonFiniteSkipHook):
    """The skip before the fix: buffers left as the forward made them."""

    def _restore_buffers(self, bad_ranks):
        return ''


def _train(hook_cls, steps=3):
    """Steps of DDP training with the hook; each rank's BatchNorm
    statistics and parameters after every step."""
    torch.manual_seed(0)
    # Moved once built: the data preprocessor learns its device from it.
    model = on_rank_device(TinyBNModel())
    ddp = MMDistributedDataParallel(model, broadcast_buffers=False)
    optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    hub = MessageHub.get_instance(f'buffers_{time.monotonic()}')
    runner = SimpleNamespace(
        model=ddp, optim_wrapper=optim_wrapper, message_hub=hub, iter=0)
    hook = hook_cls()
    hook.before_train(runner)
    generator = torch.Generator().manual_seed(dist.get_rank())
    after_step = []
    for index in range(steps):
        batch = dict(inputs=torch.randn(8, 4, generator=generator))
        hook.before_train_iter(runner, index, batch)
        ddp.train_step(batch, optim_wrapper)
        hook.after_train_iter(runner, index, batch)
        runner.iter += 1
        after_step.append(
            dict(
                mean=model.bn.running_mean.clone(),
                var=model.bn.running_var.clone(),
                params=torch.cat(
                    [p.detach().flatten() for p in model.parameters()])))
    hook.after_train(runner)
    return dict(after_step=after_step, skips=hook.total_skips)


def _scenarios():
    return [_train(NonFiniteSkipHook), _train(NoBufferRestore)]


def _finite(state):
    return bool(
        torch.isfinite(state['mean']).all()
        and torch.isfinite(state['var']).all())


def test_skip_restores_buffers_on_the_offending_rank():
    results = run_on_ranks(_scenarios, 2, timeout=60)
    (fixed0, stock0), (fixed1, stock1) = results
    skipped = NAN_CALL - 1
    for fixed in (fixed0, fixed1):
        assert fixed['skips'] == 1
        assert all(_finite(s) for s in fixed['after_step'])
    # The offending rank took the healthy rank's statistics.
    assert torch.equal(fixed1['after_step'][skipped]['mean'],
                       fixed0['after_step'][skipped]['mean'])
    assert torch.equal(fixed1['after_step'][skipped]['var'],
                       fixed0['after_step'][skipped]['var'])
    # The healthy rank kept its own, and every replica's parameters agree.
    assert torch.equal(fixed0['after_step'][skipped]['mean'],
                       stock0['after_step'][skipped]['mean'])
    for step in range(3):
        assert torch.equal(fixed0['after_step'][step]['params'],
                           fixed1['after_step'][step]['params'])
    # Negative control: the skip alone leaves rank 1's statistics NaN for
    # good, and only there.
    assert all(_finite(s) for s in stock0['after_step'])
    assert not _finite(stock1['after_step'][skipped])
    assert not _finite(stock1['after_step'][-1])
