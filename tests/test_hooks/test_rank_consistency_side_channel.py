"""RankConsistencyHook falls back to the store when its gloo side group
cannot be created (issue 14, case 9), on 2 real gloo ranks where gloo is
pointed at a network interface that does not exist."""
import os
import time
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper

from mmddp_ext.hooks import RankConsistencyHook
from mmddp_ext.hooks.rank_consistency_hook import RankDivergenceError
from mmddp_ext.testing import on_rank_device, run_on_ranks

from ..test_wrappers.auto_ddp_tiny import LogCapture

NO_SUCH_INTERFACE = 'mmddp_no_if0'


class TinyKeysModel(BaseModel):
    """Rank 1 has an extra loss key in forward call 2."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss'):
        self.calls += 1
        out = self.linear(inputs)
        losses = dict(loss_main=out.pow(2).mean())
        if self.calls == 2 and dist.get_rank() == 1:
            losses['loss_aux'] = out.abs().mean()
        return losses


def _train_with_unreachable_gloo():
    # The default group exists; gloo groups created from now on cannot
    # find their interface, as on a node where gloo cannot connect.
    os.environ['GLOO_SOCKET_IFNAME'] = NO_SUCH_INTERFACE
    try:
        dist.new_group(backend='gloo')
        plain_error = None
    except RuntimeError as error:  # what the hook hit before the fix
        plain_error = str(error)
    model = on_rank_device(TinyKeysModel())
    optim_wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    hub = MessageHub.get_instance(f'side_{time.monotonic()}')
    runner = SimpleNamespace(
        model=model, optim_wrapper=optim_wrapper, message_hub=hub, iter=0)
    hook = RankConsistencyHook()
    capture = LogCapture()
    hook.before_train(runner)
    outcomes = []
    for index in range(2):
        batch = dict(inputs=torch.ones(2, 4))
        hook.before_train_iter(runner, index, batch)
        try:
            model.train_step(batch, optim_wrapper)
            outcomes.append(None)
        except RankDivergenceError as error:
            outcomes.append(str(error))
        hook.after_train_iter(runner, index, batch)
        runner.iter += 1
    capture.close()
    return dict(
        plain_error=plain_error,
        channel=hook._side.kind,
        log=capture.messages,
        outcomes=outcomes)


def test_store_fallback_when_gloo_cannot_connect():
    results = run_on_ranks(_train_with_unreachable_gloo, 2, timeout=60)
    for result in results:
        # Negative control: a plain gloo group fails here.
        assert NO_SUCH_INTERFACE in result['plain_error']
        assert result['channel'] == 'store'
        fallback = [m for m in result['log'] if 'GLOO_SOCKET_IFNAME' in m]
        assert len(fallback) == 1
        assert fallback[0].startswith(
            'RankConsistencyHook: could not create a gloo side group')
        assert "using the default group's store instead" in fallback[0]
        # The run goes on, and the checks still work over the store.
        first, second = result['outcomes']
        assert first is None
        assert second.startswith('RankConsistencyHook: the ranks diverged '
                                 'in iteration 2')
        assert 'rank 1 has extra loss key(s) loss_aux' in second
    assert results[0]['outcomes'] == results[1]['outcomes']
