"""A tiny model whose optional parameter ``extra`` (on the model root) is
used by a chosen pattern, and a driver that trains it under AutoDDP on
each rank of :func:`mmddp_ext.testing.run_on_ranks` (no mmdet needed)."""
import logging
import time
from typing import Dict, List, Optional, Type

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MessageHub, MMLogger
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper

from mmddp_ext.testing import on_rank_device


def extra_used(pattern: str, call: int, rank: int) -> bool:
    """Whether forward call ``call`` (1-based) on ``rank`` uses ``extra``.

    Patterns: ``'never'``; ``'always'``; ``'nosync_micro_steps'`` (the odd
    calls, which are the ``no_sync`` micro-steps with
    ``accumulative_counts=2``); ``'from_call_2'``; ``'not_on_rank1_from_3'``
    (every rank in calls 1-2, then only rank 0).
    """
    if pattern == 'never':
        return False
    if pattern == 'always':
        return True
    if pattern == 'nosync_micro_steps':
        return call % 2 == 1
    if pattern == 'from_call_2':
        return call >= 2
    if pattern == 'not_on_rank1_from_3':
        return call <= 2 or rank != 1
    raise ValueError(f'unknown pattern {pattern!r}')


class TinyModel(BaseModel):
    """``body`` and ``head`` always train; ``extra`` is a parameter on the
    model root, used as ``pattern`` says."""

    def __init__(self, pattern: str = 'always'):
        super().__init__()
        self.body = nn.Linear(4, 4)
        self.head = nn.Linear(4, 1)
        self.extra = nn.Parameter(torch.ones(1))
        self.pattern = pattern
        self.calls = 0

    def forward(self, inputs, data_samples=None, mode='loss'):
        self.calls += 1
        loss = self.head(self.body(inputs).relu()).pow(2).mean()
        if extra_used(self.pattern, self.calls, dist.get_rank()):
            loss = loss + 0.1 * self.extra.sum()
        return dict(loss=loss)


class LogCapture(logging.Handler):
    """Messages of the current MMEngine logger, on this rank."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: List[str] = []
        MMLogger.get_current_instance().addHandler(self)

    def emit(self, record):
        self.messages.append(record.getMessage())

    def close(self):
        MMLogger.get_current_instance().removeHandler(self)
        super().close()


def train_tiny(pattern: str,
               iters: int,
               wrapper_cls: Optional[Type] = None,
               wrapper_kwargs: Optional[Dict] = None,
               accumulative_counts: int = 1) -> dict:
    """Train :class:`TinyModel` on this rank; never raises.

    Returns:
        dict: ``error`` (``'Type: message'`` or None), ``iters_done``,
        ``seconds`` (from the start of the failing iteration to the
        error), ``decision``, ``find_unused``, ``reducer_has_extra`` (by
        identity, in DDP's reducer parameter list), ``log`` (messages),
        ``wrapper_hook_calls`` (a forward pre-hook registered on the
        wrapper before training), ``extra`` (its final value).
    """
    from mmddp_ext.wrappers import AutoDDP
    wrapper_cls = wrapper_cls or AutoDDP
    # A hub of its own, as a Runner has: the decision is kept there.
    MessageHub.get_instance(f'train_tiny_{time.monotonic()}')
    torch.manual_seed(0)
    model = on_rank_device(TinyModel(pattern))
    ddp = wrapper_cls(model, broadcast_buffers=False, **(wrapper_kwargs or {}))
    hook_calls = []
    ddp.register_forward_pre_hook(lambda *args: hook_calls.append(1))
    optim_wrapper = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1),
        accumulative_counts=accumulative_counts)
    capture = LogCapture()
    generator = torch.Generator().manual_seed(dist.get_rank())
    error, seconds, done = None, None, 0
    for _ in range(iters):
        batch = dict(inputs=torch.randn(2, 4, generator=generator))
        started = time.monotonic()
        try:
            ddp.train_step(batch, optim_wrapper)
        except Exception as exc:  # reported to the test
            error = f'{type(exc).__name__}: {exc}'
            seconds = time.monotonic() - started
            break
        done += 1
    capture.close()
    reducer_has_extra = None
    if getattr(ddp, 'ddp_built', True) and hasattr(ddp, 'reducer'):
        params, _ = ddp._build_params_for_reducer()
        reducer_has_extra = any(p is model.extra for p in params)
    return dict(
        error=error,
        iters_done=done,
        seconds=seconds,
        decision=getattr(ddp, 'autoddp_decision', None),
        find_unused=getattr(ddp, 'find_unused_parameters', None),
        reducer_has_extra=reducer_has_extra,
        log=capture.messages,
        wrapper_hook_calls=len(hook_calls),
        extra=model.extra.detach().clone())
