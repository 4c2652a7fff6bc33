"""A rank SIGKILLed while its peers wait in the side channel (issue 28,
case 4), on 3 real gloo ranks in plain processes that no launcher kills:
every survivor stops within seconds, on the store fallback (where gloo
cannot connect) as on the gloo side group."""
import datetime
import json
import os
import os.path as osp
import signal
import time

import pytest

from mmddp_ext.launch.side_channel import VANISHED_ENV
from mmddp_ext.testing import MultiRankError, run_on_ranks

NO_SUCH_INTERFACE = 'mmddp_no_if0'
# Long enough that a survivor stopping before it was not stopped by the
# collective timeout (the run_on_ranks parent kills the survivors 10 s
# after the SIGKILL, well before it).
GROUP_TIMEOUT_S = 120
WITHIN_S = 10
KILLED_RANK = 2


def _wait_for_a_killed_peer(kind: str, out_dir: str) -> None:
    import contextlib

    import torch.distributed as dist

    from mmddp_ext.launch.side_channel import SideChannel
    if kind == 'gloo_kept_open':  # the negative control's channel
        SideChannel._gloo_failure = contextlib.nullcontext
    dist.init_process_group(
        'gloo', timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    if kind == 'store':
        # Side groups created from now on cannot connect, as on nodes where
        # gloo cannot reach the others.
        os.environ['GLOO_SOCKET_IFNAME'] = NO_SUCH_INTERFACE
    channel = SideChannel.open('VanishTest')
    assert channel.kind == ('store' if kind == 'store' else 'gloo side group')
    for call in range(3):
        channel.all_gather_object(call)
    rank = dist.get_rank()
    if rank == KILLED_RANK:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        channel.sum_ints([1])
        outcome = 'returned'
    except RuntimeError as error:
        outcome = f'{type(error).__name__}: {error}'
    # written whole or not at all: run_on_ranks may kill a survivor while
    # it writes (an empty file failed the reading once, 2026-11-28)
    path = osp.join(out_dir, f'rank{rank}.json')
    with open(path + '.part', 'w') as f:
        json.dump(dict(seconds=time.monotonic() - start, outcome=outcome), f)
    os.replace(path + '.part', path)


def _run(kind, tmp_path, env=None):
    """The survivors' outcomes; None for a survivor that never stopped
    (killed by run_on_ranks 10 s after the SIGKILL)."""
    out_dir = str(tmp_path)
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            _wait_for_a_killed_peer,
            3,
            args=(kind, out_dir),
            init_group=False,
            env=env,
            timeout=90)
    assert f'===== rank {KILLED_RANK}: no result (exit code -9)' in str(
        info.value)
    outcomes = []
    for rank in range(3):
        path = osp.join(out_dir, f'rank{rank}.json')
        if rank != KILLED_RANK:
            outcomes.append(
                json.load(open(path)) if osp.exists(path) else None)
    return outcomes


@pytest.mark.parametrize('kind', ['store', 'gloo'])
def test_every_survivor_stops_within_seconds(kind, tmp_path):
    for outcome in _run(kind, tmp_path):
        assert outcome is not None, 'a survivor kept waiting'
        assert outcome['seconds'] < WITHIN_S, outcome
        if kind == 'store':  # found by its silent heartbeat
            assert outcome['outcome'].startswith(
                'PeerVanishedError: VanishTest.1: rank 2 vanished: rank '
            ), outcome
        else:  # gloo fails a survivor; it closes its side group
            assert outcome['outcome'].startswith(
                'PeerVanishedError: VanishTest.1: a collective on the gloo '
                'side group failed on rank '), outcome


def test_without_heartbeats_the_survivors_keep_waiting(tmp_path):
    """Negative control: with the liveness check off, the survivors wait
    on the store for the collective timeout (300 s by default); none has
    stopped when run_on_ranks kills them, 10 s after the SIGKILL (a
    survivor may still report the connection reset of that kill, when the
    rank hosting the store goes first)."""
    for outcome in _run('store', tmp_path, env={VANISHED_ENV: '0'}):
        assert outcome is None or (
            outcome['seconds'] >= WITHIN_S
            and 'PeerVanishedError' not in outcome['outcome']), outcome


def test_gloo_survivor_waiting_for_a_survivor_hangs_if_kept_open(tmp_path):
    """Negative control: in gloo's ring all-reduce only rank 1 talks to the
    killed rank 2; if rank 1 keeps its side group open after failing,
    rank 0, which waits for rank 1, never stops."""
    failed, hung = _run('gloo_kept_open', tmp_path)[::-1]
    assert hung is None
    assert 'Connection' in failed['outcome'], failed
