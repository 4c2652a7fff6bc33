"""A side channel between the ranks for control decisions.

Checks that decide whether every rank stops (AutoDDP's usage check,
RankConsistencyHook's fingerprints) must not run on the default process
group: DDP's gradient all-reduces may still be pending there, and a check
would pair with one of them on the ranks that launched fewer. They run on a
gloo group of their own, or, where gloo cannot connect (multi-node NCCL
jobs whose hostname resolves to loopback, InfiniBand-only fabrics), on the
default group's key-value store, which every launcher already reaches.
"""
import datetime
import logging
import pickle
from collections import Counter
from typing import Any, List, Optional

import torch
import torch.distributed as dist
from mmengine.logging import print_log

from .dist_env import release_gloo_work_before_exit

STORE_PREFIX = 'mmddp_ext/side'
# Channels opened per name in this process: every rank opens them in the
# same order, so the count gives each one store keys of its own.
_OPENED: Counter = Counter()


def default_group_timeout() -> Optional[datetime.timedelta]:
    """The default process group's collective timeout, if torch shows it."""
    group = dist.distributed_c10d._get_default_group()
    for device in ('cpu', 'cuda'):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def _new_gloo_group():
    """A gloo group of every rank, with the default group's timeout."""
    group = dist.new_group(backend='gloo', timeout=default_group_timeout())
    release_gloo_work_before_exit()
    return group


class SideChannel:
    """Small collectives on a gloo side group or on the store.

    Every rank must make the same calls in the same order, as with any
    collective. Open one with :meth:`open`.

    Args:
        name (str): Names the channel in logs and store keys.
        group (ProcessGroup, optional): The gloo side group, or None to
            use the store.
    """

    def __init__(self, name: str, group=None) -> None:
        self.name = name
        self.group = group
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self._calls = 0
        self._store = None
        self._timeout = default_group_timeout() or datetime.timedelta(
            minutes=30)
        if group is None:
            self._store = dist.distributed_c10d._get_default_store()

    @property
    def kind(self) -> str:
        return 'gloo side group' if self.group is not None else 'store'

    @classmethod
    def open(cls, name: str) -> 'SideChannel':
        """Create a gloo side group on every rank, or fall back to the
        store on every rank when any rank could not create it.

        A collective call: every rank of the default group calls it.
        """
        _OPENED[name] += 1
        keyed_name = f'{name}.{_OPENED[name]}'
        group, error = None, None
        try:
            group = _new_gloo_group()
        except (RuntimeError, ValueError) as exc:  # gloo could not connect
            error = exc
        store_channel = cls(keyed_name, group=None)
        oks = store_channel._gather_via_store(error is None)
        if all(oks):
            return cls(keyed_name, group=group)
        failed = [r for r, ok in enumerate(oks) if not ok]
        reason = str(error).splitlines()[0][:200] if error else (
            f'it failed on rank(s) {failed}')
        print_log(
            f'{name}: could not create a gloo side group ({reason}); using '
            "the default group's store instead. Set GLOO_SOCKET_IFNAME to a "
            'network interface that reaches every node (e.g. eth0) to use '
            'gloo.',
            logger='current',
            level=logging.WARNING)
        return store_channel

    # ----------------------------------------------------------- primitives
    def all_gather_object(self, obj: Any) -> List[Any]:
        """``obj`` from every rank, in rank order."""
        if self.group is None:
            return self._gather_via_store(obj)
        gathered: List[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def all_gather_ints(self, values: List[int]) -> List[List[int]]:
        """Each rank's list of ints (the same length everywhere)."""
        if self.group is None:
            return self._gather_via_store(list(values))
        row = torch.tensor(values, dtype=torch.int64)
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        dist.all_gather(rows, row, group=self.group)
        return [r.tolist() for r in rows]

    def sum_ints(self, values: List[int]) -> List[int]:
        """Element-wise sum of every rank's ints."""
        if self.group is None:
            rows = self._gather_via_store(list(values))
            return [sum(column) for column in zip(*rows)]
        total = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(total, group=self.group)
        return total.tolist()

    def _gather_via_store(self, obj: Any) -> List[Any]:
        """Each rank writes its key for this call, waits for every rank's
        and reads them; it then deletes its key of two calls ago, which
        every rank has read by now (each wrote its key of the last call
        only after reading those)."""
        call = self._calls
        self._calls += 1
        keys = [self._key(call, r) for r in range(self.world_size)]
        self._store.set(keys[self.rank], pickle.dumps(obj))
        self._store.wait(keys, self._timeout)
        values = [pickle.loads(v) for v in self._store.multi_get(keys)]
        if call >= 2:
            self._store.delete_key(self._key(call - 2, self.rank))
        return values

    def _key(self, call: int, rank: int) -> str:
        return f'{STORE_PREFIX}/{self.name}/{call}/{rank}'
