"""Record the ``torch.distributed`` collectives a model issues, without
letting a divergence hang the probe.

Every collective called through the ``torch.distributed`` module (MMDet's
``reduce_mean``, MMEngine's ``mmengine.dist``, ``SyncBatchNorm``) is
recorded as ``op(dtype[shape], ...)``. Before it runs, the ranks compare
the call on a gloo group of their own (*lockstep*): the same call on every
rank runs for real; a different call, or a rank that has already finished
its phase, marks the divergence and every rank finishes the phase with
local, single-process semantics. So the probe records what each rank would
have done and always comes back, where the real run would hang.
"""
import contextlib
from typing import Any, Dict, Iterator, List, Optional

import torch
import torch.distributed as dist

OPS = ('all_reduce', 'all_gather', 'all_gather_into_tensor',
       'all_gather_object', 'broadcast', 'broadcast_object_list', 'reduce',
       'reduce_scatter', 'reduce_scatter_tensor', 'gather', 'scatter',
       'all_to_all', 'all_to_all_single', 'barrier')
# Python functions that only look at the process group; the single-process
# view of the gradient-equivalence reference replaces them.
GROUP_QUERIES = ('is_initialized', 'get_world_size', 'get_rank')


class _DoneWork:
    """What an ``async_op=True`` call returns when it ran locally."""

    def wait(self, *args, **kwargs) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).replace('torch.', '')
        return f'{dtype}{list(value.shape)}'
    if isinstance(value, (list, tuple)):
        inner = [_describe(v) for v in value[:4]]
        more = f', +{len(value) - 4}' if len(value) > 4 else ''
        return '[' + ', '.join(inner) + more + ']'
    return type(value).__name__


def signature(op: str, args: tuple, kwargs: dict) -> str:
    """``'all_reduce(float32[1])'``: the op and the shapes it moves."""
    tensors = [a for a in args if isinstance(a, (torch.Tensor, list, tuple))]
    return f'{op}({", ".join(_describe(t) for t in tensors)})'


def _run_locally(op: str, args: tuple, kwargs: dict) -> Any:
    """World-size-1 semantics of ``op``: gathers repeat the local value,
    reductions and broadcasts leave it as it is."""
    if op == 'all_gather' and args:
        for out in args[0]:
            out.copy_(args[1])
    elif op == 'all_gather_into_tensor' and args:
        out, local = args[0], args[1]
        out.view(-1, *local.shape).copy_(local.expand_as(
            out.view(-1, *local.shape)))
    elif op == 'all_gather_object' and args:
        for i in range(len(args[0])):
            args[0][i] = args[1]
    elif op in ('reduce_scatter_tensor', 'reduce_scatter') and args:
        out, source = args[0], args[1]
        if isinstance(source, torch.Tensor):
            out.copy_(source.view(-1, *out.shape)[0])
        else:
            out.copy_(source[0])
    elif op == 'all_to_all_single' and args:
        args[0].copy_(args[1])
    return _DoneWork() if kwargs.get('async_op') else None


class CollectiveRecorder:
    """Patches ``torch.distributed``'s collectives while active.

    Args:
        side_group: A gloo process group used only for the lockstep
            comparison (create it before the recorder is active).
    """

    def __init__(self, side_group) -> None:
        self.side_group = side_group
        self.originals = {name: getattr(dist, name) for name in OPS}
        self.events: List[Dict[str, Any]] = []
        self.divergence: Optional[Dict[str, Any]] = None
        self.phase = ''
        self._local = False

    # --------------------------------------------------------------- api
    @property
    def diverged(self) -> bool:
        """The ranks have diverged in this iteration: its collectives run
        with single-process semantics until :meth:`start_iteration`."""
        return self._local

    def start_iteration(self) -> None:
        self.events, self.divergence, self._local = [], None, False

    @contextlib.contextmanager
    def recording(self, phase: str) -> Iterator[None]:
        """Record (and lockstep) the collectives issued inside the block;
        at its end the ranks check that they all finished the phase."""
        self.phase = phase
        patched = {name: self._wrap(name) for name in OPS}
        for name, fn in patched.items():
            setattr(dist, name, fn)
        try:
            yield
        finally:
            for name, fn in self.originals.items():
                setattr(dist, name, fn)
        self._agree(f'<end of {phase}>')

    def report_failure(self, error: BaseException) -> None:
        """Tell the peers that this rank stopped early (they finish their
        phase locally instead of waiting)."""
        self._agree(f'<error: {type(error).__name__}>')

    # ---------------------------------------------------------- internals
    def _agree(self, mark: str) -> bool:
        """Compare ``mark`` across ranks; on the first difference, switch
        every rank to local semantics for the rest of the iteration."""
        if self._local:
            return False
        marks: List[Any] = [None] * dist.get_world_size(self.side_group)
        self.originals['all_gather_object'](
            marks, mark, group=self.side_group)
        if len(set(marks)) == 1:
            return True
        self._local = True
        self.divergence = dict(
            index=len([e for e in self.events if e['phase'] == self.phase]),
            phase=self.phase,
            per_rank=marks)
        return False

    def _wrap(self, name: str):
        original = self.originals[name]

        def collective(*args, **kwargs):
            group = kwargs.get('group')
            if group is self.side_group:
                return original(*args, **kwargs)
            sig = signature(name, args, kwargs)
            # DDP's gradient buckets go over the default group; a call on
            # another group (a hook's side channel) cannot pair with them.
            event = dict(
                phase=self.phase,
                call=sig,
                default_group=group in (None, dist.group.WORLD))
            if self._agree(sig):
                self.events.append(event)
                return original(*args, **kwargs)
            self.events.append(dict(event, local=True))
            return _run_locally(name, args, kwargs)

        return collective


@contextlib.contextmanager
def single_process_view() -> Iterator[None]:
    """Make this rank look like a process without a process group, so
    that a reference forward over the whole batch normalises as one
    process would (``reduce_mean`` returns its input)."""
    saved = {name: getattr(dist, name) for name in GROUP_QUERIES}
    dist.is_initialized = lambda: False
    dist.get_world_size = lambda group=None: 1
    dist.get_rank = lambda group=None: 0
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)
