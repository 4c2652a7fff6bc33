"""A side channel between the ranks for control decisions.

Checks that decide whether every rank stops (AutoDDP's usage check,
RankConsistencyHook's fingerprints) must not run on the default process
group: DDP's gradient all-reduces may still be pending there, and a check
would pair with one of them on the ranks that launched fewer. They run on a
gloo group of their own, or, where gloo cannot connect (multi-node NCCL
jobs whose hostname resolves to loopback, InfiniBand-only fabrics), on the
default group's key-value store, which every launcher already reaches.

On the store, a rank that dies (SIGKILL, out of memory, a lost node)
would leave its peers waiting for its key until the group timeout. So
every rank on a store channel bumps a counter on the store every
:data:`HEARTBEAT_S` seconds from a thread of its own (over its own store
connection), and a rank waiting for peers polls for their keys and, once a
second, looks at the counters of those still missing: one whose counter
has not moved for :data:`VANISHED_AFTER_S` seconds is gone, and every
waiting rank raises :class:`PeerVanishedError` naming it.
``MMDDP_EXT_SIDE_VANISHED_S`` sets that time (``0`` waits for the group
timeout instead). A gloo side group needs none of this: gloo fails a
collective as soon as a peer's connection closes.
"""
import atexit
import contextlib
import datetime
import logging
import os
import pickle
import threading
import time
from collections import Counter
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
from mmengine.logging import print_log

from ..utils.torch_private import default_store, group_timeout
from .process_group import release_gloo_work_before_exit

STORE_PREFIX = 'mmddp_ext/side'
# Channels opened per name in this process: every rank opens them in the
# same order, so the count gives each one store keys of its own.
_OPENED: Counter = Counter()
HEARTBEAT_S = 1.0
VANISHED_AFTER_S = 5.0
VANISHED_ENV = 'MMDDP_EXT_SIDE_VANISHED_S'
# Waiting for keys polls the store, backing off up to this interval.
_MAX_POLL_S = 0.05


class PeerVanishedError(RuntimeError):
    """A rank stopped showing signs of life while its peers waited for it
    on the store side channel; raised on every waiting rank."""


def vanished_after_s() -> float:
    """Seconds without a heartbeat after which a peer is taken for gone
    (``MMDDP_EXT_SIDE_VANISHED_S``; 0: never)."""
    text = os.environ.get(VANISHED_ENV, '').strip()
    if not text:
        return VANISHED_AFTER_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(
            f'{VANISHED_ENV} must be a number of seconds >= 0 (0: wait for '
            f'the group timeout), but got {text!r}.')
    return value


# Per peer: its heartbeat count when last seen to change, and when.
_Seen = Dict[int, Tuple[int, float]]


def _alive_key(rank: int) -> str:
    return f'{STORE_PREFIX}/alive/{rank}'


class _Heartbeat:
    """Bumps this rank's counter on the store every :data:`HEARTBEAT_S`
    from a daemon thread, over a clone of the store (a connection of its
    own, so it never queues behind a blocking call of the main thread).
    The first beat happens before the constructor returns."""

    def __init__(self, store, rank: int) -> None:
        self._store = store.clone()
        self._key = _alive_key(rank)
        self._stop = threading.Event()
        self._store.add(self._key, 1)
        self._thread = threading.Thread(
            target=self._run, name='mmddp_ext-side-heartbeat', daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._store.add(self._key, 1)
            except RuntimeError:  # the store is gone: the run is ending
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=HEARTBEAT_S + 1)


_heartbeat: Optional[_Heartbeat] = None


def _start_heartbeat(store, rank: int) -> None:
    global _heartbeat
    if _heartbeat is None:
        _heartbeat = _Heartbeat(store, rank)


def default_group_timeout() -> Optional[datetime.timedelta]:
    """The default process group's collective timeout, if torch shows it."""
    return group_timeout(dist.group.WORLD)
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
        self._vanished_after_s = vanished_after_s()
        if group is None:
            self._store = default_store()

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
        if store_channel._vanished_after_s:
            _start_heartbeat(store_channel._store, store_channel.rank)
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
        with self._gloo_failure():
            dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def all_gather_ints(self, values: List[int]) -> List[List[int]]:
        """Each rank's list of ints (the same length everywhere)."""
        if self.group is None:
            return self._gather_via_store(list(values))
        # On the host wherever the rank computes: the side group is gloo,
        # whose all_gather takes CPU tensors only, and a CUDA tensor would
        # also change which peers gloo's all-reduce connects (the rank that
        # closes its group on a failure must be the one next to the dead).
        row = torch.tensor(values, dtype=torch.int64, device='cpu')
        rows = [torch.empty_like(row) for _ in range(self.world_size)]
        with self._gloo_failure():
            dist.all_gather(rows, row, group=self.group)
        return [r.tolist() for r in rows]

    def sum_ints(self, values: List[int]) -> List[int]:
        """Element-wise sum of every rank's ints."""
        if self.group is None:
            rows = self._gather_via_store(list(values))
            return [sum(column) for column in zip(*rows)]
        total = torch.tensor(values, dtype=torch.int64, device='cpu')
        with self._gloo_failure():
            dist.all_reduce(total, group=self.group)
        return total.tolist()

    @contextlib.contextmanager
    def _gloo_failure(self):
        """Pass a failed side-group collective on to every peer.

        gloo fails a collective on the ranks connected to a peer that died,
        but a rank that waits for one of those (not for the dead one)
        would wait for the group timeout. Closing this rank's side group
        closes its connections, so those ranks fail at once as well.
        """
        try:
            yield
        except RuntimeError as error:
            group, self.group = self.group, None
            dist.destroy_process_group(group)
            raise PeerVanishedError(
                f'{self.name}: a collective on the gloo side group failed '
                f'on rank {self.rank} ({str(error).splitlines()[0][:300]}); '
                'a peer rank probably died (see the logs of the other '
                'ranks). This rank closed its side group so that every '
                'rank stops.') from error

    def _gather_via_store(self, obj: Any) -> List[Any]:
        """Each rank writes its key for this call, waits for every rank's
        and reads them; it then deletes its key of two calls ago, which
        every rank has read by now (each wrote its key of the last call
        only after reading those)."""
        call = self._calls
        self._calls += 1
        keys = [self._key(call, r) for r in range(self.world_size)]
        self._store.set(keys[self.rank], pickle.dumps(obj))
        self._wait_for(keys)
        values = [pickle.loads(v) for v in self._store.multi_get(keys)]
        if call >= 2:
            self._store.delete_key(self._key(call - 2, self.rank))
        return values

    def _wait_for(self, keys: List[str]) -> None:
        """Poll until every key is set. Once a second, the heartbeats of
        the ranks whose keys are missing are read: a peer that has beaten
        before and has not for ``vanished_after_s`` seconds is gone
        (:class:`PeerVanishedError`); one that never beat has not opened
        this channel yet and is waited for until the group timeout."""
        start = time.monotonic()
        deadline = start + self._timeout.total_seconds()
        next_look = start + HEARTBEAT_S
        seen: _Seen = {}
        delay = 0.0005
        while not self._store.check(keys):
            now = time.monotonic()
            if now >= deadline:
                raise RuntimeError(
                    f'{self.name}: timed out after '
                    f'{self._timeout.total_seconds():.0f}s waiting for rank'
                    f'(s) {self._missing(keys)} on the store side channel.')
            if self._vanished_after_s and now >= next_look:
                next_look = now + HEARTBEAT_S
                self._check_alive(self._missing(keys), seen, now, start)
            time.sleep(delay)
            delay = min(2 * delay, _MAX_POLL_S)

    def _missing(self, keys: List[str]) -> List[int]:
        return [
            r for r, key in enumerate(keys) if not self._store.check([key])
        ]

    def _check_alive(self, missing: List[int], seen: _Seen, now: float,
                     start: float) -> None:
        for rank in missing:
            beats = int(self._store.add(_alive_key(rank), 0))
            if beats == 0:
                continue
            if rank not in seen or seen[rank][0] != beats:
                seen[rank] = (beats, now)
                continue
            silent = now - seen[rank][1]
            if silent >= self._vanished_after_s:
                raise PeerVanishedError(
                    f'{self.name}: rank {rank} vanished: rank {self.rank} '
                    f'waited {now - start:.0f}s for it on the store side '
                    f'channel, and its heartbeat has not moved for '
                    f'{silent:.0f}s (it was probably killed: out of memory, '
                    'SIGKILL, a lost node; see its log). Every rank that '
                    'waits for it stops here; resume from the latest '
                    'checkpoint (tools/dist_train.sh with MAX_RESTARTS does '
                    f'by itself). {VANISHED_ENV} sets how long a silent '
                    'rank is waited for.')

    def _key(self, call: int, rank: int) -> str:
        return f'{STORE_PREFIX}/{self.name}/{call}/{rank}'
