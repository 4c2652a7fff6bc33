"""Run code on N real gloo ranks with a hard timeout and every rank's log.

Used by the DDP doctor's probe, by the tests (through
:mod:`mmddp_ext.testing`, which re-exports it) and by the benchmarks.
Two entry points:

- :func:`run_on_ranks` runs a picklable function in N fresh processes
  that share a freshly initialised gloo process group.
- :func:`run_command` runs a launcher command (``tools/dist_train.sh``)
  in its own process group and kills the whole group on timeout.

Both raise :class:`MultiRankError` with every rank's output attached when a
rank fails or the deadline passes, so a hang fails in about a minute and
shows what each rank was doing.
"""
import contextlib
import glob
import os
import os.path as osp
import pickle
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch
import torch.multiprocessing as mp
from torch.overrides import TorchFunctionMode

from .environments import without_outer_launcher
from .process_group import index_cards_by_local_rank

LOG_TAIL_CHARS = 6000
# Environment variable naming the ranks' default device (cpu or cuda).
RANK_DEVICE_ENV = 'MMDDP_EXT_RANK_DEVICE'
FAILURE_GRACE_S = 10
# How long the ranks may take to start (interpreter and imports) before
# the run's own timeout starts counting.
STARTUP_LIMIT_S = 60
# Upper bound on how long a finished rank waits for its peers to report,
# in case the parent is gone; the parent's own timeout normally ends it.
PEER_WAIT_LIMIT_S = 900
# Ranks fork from a multiprocessing fork server that imported these once:
# a fresh interpreter spends about 10 s of CPU importing them on a small
# machine, for every rank of every run. Importing starts no threads and no
# process group, so forking the server is safe.
FORKSERVER_PRELOAD = ('torch', 'torch.distributed', 'mmengine.runner',
                      'mmdet.models', 'mmddp_ext')
# torch's factory draws that take a generator and no input tensor.
_DRAWS = frozenset(('rand', 'randn', 'randint', 'randperm'))


_launches = 0


def _count_launch() -> None:
    global _launches
    _launches += 1


def launch_count() -> int:
    """How many runs :func:`run_on_ranks` and :func:`run_command` have
    started in this process (the tests' ``multi_rank`` marker checks that
    every test that starts one carries it)."""
    return _launches


class MultiRankError(RuntimeError):
    """A multi-rank run failed or timed out; the message holds the logs."""


# Where the kernel draws ephemeral ports when it is not told otherwise.
EPHEMERAL_RANGE_FILE = '/proc/sys/net/ipv4/ip_local_port_range'
LINUX_EPHEMERAL_RANGE = (32768, 60999)
LOWEST_PORT = 10000


def ephemeral_port_range() -> range:
    """The ports the kernel hands out to ``bind(0)`` and ``connect()``."""
    try:
        with open(EPHEMERAL_RANGE_FILE) as f:
            low, high = (int(v) for v in f.read().split())
    except (OSError, ValueError):
        low, high = LINUX_EPHEMERAL_RANGE
    return range(low, high + 1)


def free_port() -> int:
    """A TCP port on localhost that is free right now, outside the kernel's
    ephemeral range.

    A port from ``bind(0)`` lies in the ephemeral range, where every
    outgoing connection (gloo opens one per rank pair) draws its local
    port: between this call and the launcher's own ``bind`` another run's
    connection could take it ("EADDRINUSE" from torchrun's store, seen with
    three test workers starting ranks side by side). A random bindable port
    below (or above) that range is only taken by another explicit ``bind``.
    """
    ephemeral = ephemeral_port_range()
    candidates = (range(LOWEST_PORT, ephemeral.start)
                  if ephemeral.start - LOWEST_PORT >= 1000 else range(
                      ephemeral.stop, 65536))
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.choice(candidates)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(('127.0.0.1', port))
            except OSError:
                continue
            return port
    raise RuntimeError(
        f'no free TCP port in {candidates.start}-{candidates.stop - 1} '
        'after 200 tries; free some ports or set the launcher\'s port '
        'explicitly (PORT=... for tools/dist_train.sh).')


def _children(pid: int) -> List[int]:
    """Direct children of ``pid`` (Linux /proc)."""
    try:
        with open(f'/proc/{pid}/task/{pid}/children') as f:
            return [int(c) for c in f.read().split()]
    except OSError:
        return []


def process_tree(pid: int) -> List[int]:
    """``pid`` and all its descendants, parents before children."""
    tree, frontier = [], [pid]
    while frontier:
        current = frontier.pop()
        tree.append(current)
        frontier.extend(_children(current))
    return tree


def kill_process_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants.

    torchrun starts its workers in sessions of their own, so killing the
    launcher's process group would leave the ranks running.
    """
    tree = process_tree(pid)
    for member in tree:
        try:
            os.kill(member, signal.SIGSTOP)  # freeze: no new children
        except ProcessLookupError:
            pass
    for member in tree + [c for m in tree for c in _children(m)]:
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _tail(text: str, limit: int = LOG_TAIL_CHARS) -> str:
    return text if len(text) <= limit else '...' + text[-limit:]


# Lines of a launcher's output that say why something stopped.
_CAUSE_LINE = re.compile(
    r'Error\b|Exception\b|Traceback|exitcode|Signal |failed|Killed|timed out',
    re.IGNORECASE)
CAUSE_LINES = 40


def _tail_with_causes(text: str, limit: int) -> str:
    """``text``'s last ``limit`` characters, preceded by the lines of the
    part cut off that name a cause (errors, tracebacks, a launcher's exit
    records): a torchrun restart's first attempt fails far above the
    tail."""
    if len(text) <= limit:
        return text
    head = text[:-limit].splitlines()
    causes = [line for line in head if _CAUSE_LINE.search(line)]
    if not causes:
        return _tail(text, limit)
    kept = causes[:CAUSE_LINES]
    more = len(causes) - len(kept)
    return ('===== lines naming a cause in the output above the tail' +
            (f' (first {len(kept)} of {len(causes)})' if more else '') +
            ':\n' + '\n'.join(kept) + '\n===== its tail\n' +
            _tail(text, limit))


def _read(path: str) -> str:
    try:
        with open(path, errors='replace') as f:
            return f.read()
    except OSError:
        return '<no log>'


def _failed(result_path: str) -> bool:
    if not osp.exists(result_path):
        return False
    with open(result_path, 'rb') as f:
        return pickle.load(f)[0] != 'ok'


class _DrawWhereTheGeneratorIs(TorchFunctionMode):
    """Under a CUDA default device, a factory call given a CPU generator
    (a test's seeded data, a sampler's ``randperm``) draws on the CPU, as
    it would without the default device, and the result moves to the
    default device; torch's default-device mode would put the draw on
    CUDA and refuse the CPU generator."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        generator = kwargs.get('generator')
        if (generator is None or kwargs.get('device') is not None
                or generator.device.type != 'cpu'
                or getattr(func, '__name__', None) not in _DRAWS):
            return func(*args, **kwargs)
        out = func(*args, device='cpu', **kwargs)
        if not isinstance(out, torch.Tensor):
            return out
        # randperm's indices index CPU lists (samplers); data moves.
        return out if func is torch.randperm else out.to(
            torch.get_default_device())


def check_rank_device(device: str) -> None:
    """Refuse a :data:`RANK_DEVICE_ENV` value no rank could use.

    Raises:
        ValueError: ``device`` is neither ``'cpu'`` nor ``'cuda'``, or is
            ``'cuda'`` on a machine without CUDA.
    """
    if device not in ('cpu', 'cuda'):
        raise ValueError(f'{RANK_DEVICE_ENV} must be cpu or cuda, but got '
                         f'{device!r}.')
    if device == 'cuda' and not torch.cuda.is_available():
        raise ValueError(f'{RANK_DEVICE_ENV}=cuda, but CUDA is not '
                         'available on this machine; unset it or use cpu.')


def _use_rank_device(device: str, rank: int) -> None:
    """Make ``device`` this rank's default for new tensors and modules:
    ``'cpu'`` (nothing to do) or ``'cuda'`` (GPU ``rank % count``, shared
    round robin; the gloo group then carries CUDA tensors)."""
    check_rank_device(device)
    if device == 'cpu':
        return
    count = torch.cuda.device_count()
    index = rank % count
    torch.cuda.set_device(index)  # initialises CUDA in this process
    torch.set_default_device(f'cuda:{index}')
    _DrawWhereTheGeneratorIs().__enter__()  # above the default device
    _full_fp32()
    # More ranks than GPUs: MMEngine's logger indexes CUDA_VISIBLE_DEVICES
    # by LOCAL_RANK (this rank's number here).
    index_cards_by_local_rank(rank, count)


class _HostPickler(pickle.Pickler):
    """Pickles a rank's result with every tensor on the host.

    A rank on a GPU returns CUDA tensors (its results, its gradients),
    which unpickle onto the parent's GPU, while the test's expectations
    are built on the CPU there: ``torch.testing.assert_close`` then
    refuses the pair, ``torch.equal`` raises. Results come back on the
    host whatever the rank's device, so every comparison in the parent is
    made there (where the same code on CPU ranks makes it).
    """

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.device.type != 'cpu':
            return obj.detach().cpu().__reduce_ex__(pickle.DEFAULT_PROTOCOL)
        return NotImplemented


def save_on_host(value: Any, path: str) -> None:
    """Pickle ``value`` to ``path`` with every tensor on the host (see
    :class:`_HostPickler`); a reader sees all of it or nothing."""
    with open(path + '.tmp', 'wb') as f:
        _HostPickler(f, pickle.DEFAULT_PROTOCOL).dump(value)
    os.replace(path + '.tmp', path)


def _full_fp32() -> None:
    """fp32 matmuls and convolutions in full precision, as on the CPU:
    the tests compare GPU ranks with single-process references at 1e-6,
    which TF32 (cuDNN's default for convolutions on Ampere and later, 10
    mantissa bits) would miss by orders of magnitude."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@contextlib.contextmanager
def like_a_rank():
    """In the caller's process, create tensors and modules as a rank of
    :func:`run_on_ranks` would under the same :data:`RANK_DEVICE_ENV`: on
    ``cuda`` on the current GPU (seeded CPU draws giving the CPU values,
    full fp32), on ``cpu`` as always. A test builds its single-process
    reference inside, so the expectation is computed where the ranks'
    results were."""
    device = os.environ.get(RANK_DEVICE_ENV, 'cpu')
    if device == 'cpu':
        yield
        return
    if device != 'cuda' or not torch.cuda.is_available():
        raise ValueError(f'{RANK_DEVICE_ENV} must be cpu, or cuda where '
                         f'CUDA is available, but got {device!r}.')
    flags = (torch.backends.cuda.matmul.allow_tf32,
             torch.backends.cudnn.allow_tf32)
    _full_fp32()
    try:
        with torch.device('cuda', torch.cuda.current_device()), \
                _DrawWhereTheGeneratorIs():
            yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32,
         torch.backends.cudnn.allow_tf32) = flags


def _rank_context(device: str):
    """The multiprocessing context that starts the ranks: the preloaded
    fork server on CPU; on CUDA a fresh interpreter per rank ('spawn'):
    the fork server's imports initialise CUDA (seen on an H100: "Cannot
    re-initialize CUDA in forked subprocess" in every forked rank)."""
    if device == 'cuda':
        return mp.get_context('spawn')
    ctx = mp.get_context('forkserver')
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # used at start
    return ctx


def _rank_main(fn: Callable, rank: int, world_size: int, port: int,
               log_dir: str, args: Sequence, kwargs: Dict,
               env: Dict[str, str], init_group: bool) -> None:
    log = open(osp.join(log_dir, f'rank{rank}.log'), 'w', buffering=1)
    open(_started_path(log_dir, rank), 'w').close()
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    # The fork server's environment is from when it started; use the
    # caller's, as a spawned process would.
    os.environ.clear()
    os.environ.update(without_outer_launcher(env))
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR='127.0.0.1',
        MASTER_PORT=str(port))
    # The fork server imported torch, and OpenMP read OMP_NUM_THREADS then;
    # the caller's value would otherwise be ignored (two ranks with two
    # spinning OpenMP threads each on a 2-core machine stall each other
    # for seconds at a time).
    threads = env.get('OMP_NUM_THREADS', '').strip()
    if threads.isdigit() and int(threads) > 0:
        import torch
        torch.set_num_threads(int(threads))
    result_path = osp.join(log_dir, f'rank{rank}.result')
    try:
        _use_rank_device(env.get(RANK_DEVICE_ENV, 'cpu'), rank)
        if init_group:
            import torch.distributed as dist
            dist.init_process_group(
                'gloo', rank=rank, world_size=world_size)
        outcome = ('ok', fn(*args, **kwargs))
    except BaseException as error:  # report everything to the parent
        traceback.print_exc()
        outcome = ('error', f'{type(error).__name__}: {error}')
    save_on_host(outcome, result_path)
    log.flush()
    # Stay up until every peer has reported (the parent kills stragglers at
    # its deadline): rank 0 hosts the rendezvous store, and a rank that
    # exits early breaks peers still setting up their gloo connections.
    peers = [osp.join(log_dir, f'rank{r}.result') for r in range(world_size)]
    deadline = time.monotonic() + PEER_WAIT_LIMIT_S
    while time.monotonic() < deadline and not all(map(osp.exists, peers)):
        time.sleep(0.1)
    # Skip the process-group teardown: a peer that failed could make
    # destroy_process_group block, and the parent already has the result.
    os._exit(0)


def _result_paths(log_dir: str, world_size: int) -> List[str]:
    return [osp.join(log_dir, f'rank{r}.result') for r in range(world_size)]


def _started_path(log_dir: str, rank: int) -> str:
    return osp.join(log_dir, f'rank{rank}.started')


def _wait_for_results(procs, log_dir: str, timeout: float):
    """Wait until every rank reported, one failed (plus a short grace for
    its peers) or ``timeout`` passed; returns ``(incomplete, timed_out)``.

    ``timeout`` counts from when the last rank started running (its
    interpreter and imports ready: a spawned rank on a busy machine takes
    tens of seconds to get there), within ``STARTUP_LIMIT_S``.
    """
    deadline = time.monotonic() + STARTUP_LIMIT_S + timeout
    started = [_started_path(log_dir, r) for r in range(len(procs))]
    all_started = False
    results_paths = _result_paths(log_dir, len(procs))
    while time.monotonic() < deadline:
        if not all_started and all(osp.exists(p) for p in started):
            all_started = True
            deadline = time.monotonic() + timeout
        elif not all_started and time.monotonic() > deadline - timeout:
            deadline = time.monotonic()  # a rank never started
            break
        if all(osp.exists(p) for p in results_paths):
            break
        if any(p.exitcode not in (None, 0) for p in procs) or any(
                _failed(p) for p in results_paths):
            # A rank failed: its peers get a short grace period to report
            # (they usually fail on the broken collective), then are killed.
            grace = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            while time.monotonic() < grace and not all(
                    osp.exists(p) for p in results_paths):
                time.sleep(0.2)
            break
        time.sleep(0.2)
    incomplete = not all(osp.exists(p) for p in results_paths)
    return incomplete, incomplete and time.monotonic() >= deadline


def _stop_ranks(procs, grace: float) -> None:
    """Join finished ranks; kill the rest with every process they started
    (DataLoader workers, subprocesses), so nothing outlives the run."""
    for proc in procs:
        if proc.pid is None:  # never started
            continue
        proc.join(timeout=grace)
        if proc.is_alive():
            kill_process_tree(proc.pid)
            proc.join()


def run_on_ranks(fn: Callable,
                 world_size: int = 2,
                 args: Sequence = (),
                 kwargs: Optional[Dict] = None,
                 timeout: float = 90,
                 env: Optional[Dict[str, str]] = None,
                 log_dir: Optional[str] = None,
                 init_group: bool = True) -> List[Any]:
    """Call ``fn(*args, **kwargs)`` on ``world_size`` gloo ranks.

    Each rank is a fresh process (forked from a fork server that has
    already imported torch, mmengine and mmdet) with the caller's
    environment and ``RANK``/``WORLD_SIZE``/
    ``LOCAL_RANK``/``MASTER_*`` set as torchrun would and the default
    process group already initialised. ``fn`` and its arguments must be
    picklable (a module-level function).

    Args:
        fn (callable): Function to run on every rank.
        world_size (int): Number of ranks. Defaults to 2.
        args (Sequence): Positional arguments for ``fn``. Defaults to ().
        kwargs (dict, optional): Keyword arguments for ``fn``.
            Defaults to None.
        timeout (float): Seconds until all ranks are killed. Defaults to 90.
        env (dict, optional): Extra environment variables for the ranks.
            ``MMDDP_EXT_RANK_DEVICE=cuda`` (here or in the caller's
            environment; ``pytest --device cuda`` sets it) makes each rank
            create its tensors and modules on a GPU (``rank % count``),
            so the same code runs with CUDA tensors. Defaults to None.
        log_dir (str, optional): Where ``rank{i}.log`` files go. Defaults to
            a new temporary directory.
        init_group (bool): Initialise the default gloo process group before
            calling ``fn``. Set False to test code that initialises it.
            Defaults to True.

    Returns:
        list: ``fn``'s return value on each rank, in rank order.

    Raises:
        ValueError: ``MMDDP_EXT_RANK_DEVICE`` names a device no rank can use
            (raised before any rank starts).
        MultiRankError: A rank raised, died or did not finish in time.
    """
    _count_launch()
    log_dir = log_dir or tempfile.mkdtemp(prefix='mmddp_ranks_')
    for rank in range(world_size):
        if osp.exists(_started_path(log_dir, rank)):
            os.remove(_started_path(log_dir, rank))
    rank_env = dict(os.environ, **(env or {}))
    device = rank_env.get(RANK_DEVICE_ENV, 'cpu')
    # Here, before any rank starts: a rank on 'cuda' is a fresh
    # interpreter that would import everything only to refuse it.
    check_rank_device(device)
    ctx = _rank_context(device)
    port = free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(fn, rank, world_size, port, log_dir, args, kwargs or {},
                  rank_env, init_group),
            # Not daemonic, so ranks can start DataLoader workers; every
            # rank is joined or killed below.
            daemon=False) for rank in range(world_size)
    ]
    try:
        for proc in procs:
            proc.start()
        incomplete, timed_out = _wait_for_results(procs, log_dir, timeout)
    except BaseException:
        # Interrupted here (pytest-timeout's signal, Ctrl-C): no rank, nor
        # anything a rank started, may outlive the run.
        _stop_ranks(procs, grace=0)
        raise
    _stop_ranks(procs, grace=0 if incomplete else 10)
    results_paths = _result_paths(log_dir, world_size)
    outcomes = []
    for rank, path in enumerate(results_paths):
        if osp.exists(path):
            with open(path, 'rb') as f:
                outcomes.append(pickle.load(f))
        else:
            outcomes.append(
                ('error', f'no result (exit code {procs[rank].exitcode})'))
    failed = [r for r, (status, _) in enumerate(outcomes) if status != 'ok']
    if timed_out or failed:
        reason = (f'timed out after {timeout:.0f}s'
                  if timed_out else f'rank(s) {failed} failed')
        raise MultiRankError(
            _format_failure(f'{world_size}-rank run of {fn.__name__} '
                            f'{reason}', outcomes, log_dir))
    return [value for _, value in outcomes]


def _format_failure(headline: str, outcomes, log_dir: str) -> str:
    parts = [headline]
    for rank, (status, value) in enumerate(outcomes):
        detail = value if status != 'ok' else 'ok'
        parts.append(f'\n===== rank {rank}: {detail}\n' + _tail(
            _read(osp.join(log_dir, f'rank{rank}.log'))))
    return '\n'.join(parts)


def _kill_command(proc: subprocess.Popen) -> None:
    kill_process_tree(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_command(cmd: Sequence[str],
                timeout: float = 120,
                env: Optional[Dict[str, str]] = None,
                cwd: Optional[str] = None,
                log_globs: Sequence[str] = (),
                check: bool = True) -> subprocess.CompletedProcess:
    """Run a launcher command with a hard timeout on its process group.

    Args:
        cmd (Sequence[str]): The command, e.g. ``['bash',
            'tools/dist_train.sh', cfg, '2']``.
        timeout (float): Seconds until the whole process group is killed.
            Defaults to 120.
        env (dict, optional): Environment variables added to the current
            ones. Defaults to None.
        cwd (str, optional): Working directory. Defaults to None.
        log_globs (Sequence[str]): Extra log files (e.g. every rank's MMEngine
            log in the work dir) to show on failure. Defaults to ().
        check (bool): Raise on a non-zero exit code. Defaults to True.

    Returns:
        subprocess.CompletedProcess: With ``stdout`` holding stdout and
        stderr together.

    Raises:
        MultiRankError: Timeout, or a non-zero exit with ``check=True``.
    """
    _count_launch()
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(
        list(cmd),
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill_command(proc)
        out, _ = proc.communicate()
        timed_out = True
    except BaseException:  # interrupted: leave nothing running
        _kill_command(proc)
        proc.wait()
        raise
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, None)
    if timed_out or (check and proc.returncode != 0):
        reason = (f'timed out after {timeout:.0f}s'
                  if timed_out else f'exited with {proc.returncode}')
        logs = [
            f'\n===== {path}\n' + _tail(_read(path))
            for pattern in log_globs for path in sorted(glob.glob(pattern))
        ]
        raise MultiRankError(f"`{' '.join(cmd)}` {reason}\n===== output\n" +
                             _tail_with_causes(out or '',
                                               3 * LOG_TAIL_CHARS) +
                             ''.join(logs))
    return result
