"""Device and launcher logic for mmddp_ext, kept in one place.

Stock MMEngine assumes one CUDA device per rank: ``init_dist('pytorch')``
calls ``torch.cuda.set_device`` and ``Runner.wrap_model`` passes
``device_ids=[LOCAL_RANK]``. Both fail on a CPU-only torch. Everything in
mmddp_ext that needs to know which backend or device a rank uses asks the
functions here instead of branching on ``torch.cuda.is_available()``
(``device_ids`` for a DDP wrapper follow from the device:
:func:`mmddp_ext.runner.ddp_setup.ddp_device_ids`).
"""
import atexit
import datetime
import logging
import math
import os
import socket
import time
from typing import List, Optional, Tuple

import torch
import torch.distributed as torch_dist
from mmengine.logging import print_log

from ..utils.torch_private import default_store
from .environments import export_slurm_rendezvous, launched_by
from .peer_watchdog import start_peer_watchdog

SUPPORTED_LAUNCHERS = ('pytorch', 'slurm', 'mpi')
TORCHRUN_ENV_KEYS = ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT')
# A hang we did not foresee becomes an error after this many seconds
# (torch's defaults are 10-30 minutes). env_cfg.dist_cfg.timeout overrides.
DEFAULT_COLLECTIVE_TIMEOUT_S = 300
# Seconds a process waits at exit, with the GIL released, before Python
# finalises; see release_gloo_work_before_exit. The environment variable
# overrides it (0 switches the wait off).
GLOO_EXIT_GRACE_S = 0.2
GLOO_EXIT_GRACE_ENV = 'MMDDP_EXT_GLOO_EXIT_GRACE_S'
_exit_grace_registered = False


def visible_gpu_count() -> int:
    """Number of CUDA devices this process can use (0 on CPU-only torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_rank() -> int:
    """Rank of this process on its machine (0 outside a launcher)."""
    return int(os.environ.get('LOCAL_RANK', 0))


def gpu_identity(device: torch.device) -> str:
    """The physical GPU behind ``device``: ``'host/uuid'``, or ``''`` for a
    CPU device.

    The UUID names the card whatever ``CUDA_VISIBLE_DEVICES`` this process
    was given (Slurm's ``--gpus-per-task`` shows each task its own card as
    ``cuda:0``); where torch has no ``uuid`` the visible device's entry in
    ``CUDA_VISIBLE_DEVICES`` stands in.
    """
    if device.type != 'cuda':
        return ''
    index = torch.cuda.current_device() if device.index is None else (
        device.index)
    uuid = getattr(torch.cuda.get_device_properties(index), 'uuid', None)
    if uuid is None:
        visible = os.environ.get('CUDA_VISIBLE_DEVICES')
        uuid = visible.split(',')[index] if visible else index
    return f'{socket.gethostname()}/{uuid}'


def decide_backend(requested: Optional[str], world_size: int, without_gpu: int,
                   sharing: int) -> Tuple[str, str]:
    """The backend of a launch from what its ranks said of their GPUs.

    NCCL needs a GPU of its own for every rank: it refuses two ranks on
    one card. So NCCL when no rank is without a GPU and none shares its
    GPU with another rank, gloo otherwise (ranks then share GPUs round
    robin, or compute on the CPU).

    Args:
        requested (str, optional): Backend from ``env_cfg.dist_cfg.backend``.
            ``None`` or ``'nccl'`` mean "the best one available"; any other
            name (``'gloo'``, ``'mpi'``) is used as given.
        world_size (int): Ranks of the launch.
        without_gpu (int): Ranks that have no CUDA device.
        sharing (int): Ranks whose GPU another rank uses too.

    Returns:
        tuple[str, str]: The backend and a short reason for the choice.
    """
    if requested not in (None, 'nccl'):
        return requested, f'backend {requested!r} requested in dist_cfg'
    if without_gpu == world_size:
        return 'gloo', 'CUDA is not available'
    if without_gpu:
        return 'gloo', (f'{without_gpu} of {world_size} ranks have no '
                        'GPU')
    if sharing:
        return 'gloo', (f'{sharing} of {world_size} ranks share a GPU with '
                        'another rank')
    return 'nccl', f'each of the {world_size} ranks has a GPU of its own'


def count_gpus_shared(store: torch_dist.Store, world_size: int, identity: str,
                      prefix: str) -> Tuple[int, int]:
    """How many ranks of the launch have no GPU, and how many share theirs
    with another rank: the same two numbers on every rank.

    Each rank counts itself under its card's :func:`gpu_identity` in the
    rendezvous store, then under "shares" when its card's count is above
    one. A rank cannot tell from what it sees alone: a task shown one GPU
    of the two on its node may share it with the other task or have it to
    itself (Slurm's ``--gpus-per-task=1``, a wrapper setting
    ``CUDA_VISIBLE_DEVICES=$SLURM_LOCALID``).

    Args:
        store (Store): The launch's rendezvous store.
        world_size (int): Ranks of the launch; every one calls this.
        identity (str): This rank's :func:`gpu_identity`.
        prefix (str): Keys of this launch attempt in the store.

    Raises:
        RuntimeError: A rank did not arrive within the store's timeout.
    """
    card = f'{prefix}/gpu/{identity}'
    store.add(card if identity else f'{prefix}/without_gpu', 1)
    _store_barrier(store, f'{prefix}/counted', world_size)
    shares = bool(identity) and store.add(card, 0) > 1
    store.add(f'{prefix}/sharing', int(shares))
    _store_barrier(store, f'{prefix}/compared', world_size)
    without_gpu = store.add(f'{prefix}/without_gpu', 0)
    return without_gpu, store.add(f'{prefix}/sharing', 0)


def _store_barrier(store: torch_dist.Store, key: str, world_size: int) -> None:
    arrived = store.add(key, 1)
    if arrived == world_size:
        store.set(f'{key}/all', '1')
    try:
        store.wait([f'{key}/all'])
    except RuntimeError as error:
        raise RuntimeError(
            f'mmddp_ext: rank {os.environ.get("RANK")} waited for every '
            f'rank to say which GPU it uses ({key}), but only '
            f'{store.add(key, 0)} of {world_size} arrived before the '
            f'timeout ({error}). A rank that never started, or that '
            'failed before this point, has its own log.') from error


def rank_device() -> torch.device:
    """The device this rank computes on.

    With GPUs, local rank ``r`` uses ``cuda:(r % num_gpus)``, so several
    ranks may share a GPU when there are fewer GPUs than ranks (gloo only).
    """
    gpus = visible_gpu_count()
    if gpus == 0:
        return torch.device('cpu')
    return torch.device('cuda', local_rank() % gpus)


def index_cards_by_local_rank(local: int, count: int) -> None:
    """Make entry ``local`` of ``CUDA_VISIBLE_DEVICES`` name this rank's
    card, for MMEngine, once CUDA is initialised in this process.

    MMEngine's logger finds a rank's GPU as
    ``CUDA_VISIBLE_DEVICES.split(',')[LOCAL_RANK]`` whenever it creates a
    logger, and raises ``IndexError`` where a rank sees fewer GPUs than
    its local rank: a Slurm task shown only its own card
    (``--gpus-per-task=1``; MMEngine's own Slurm set-up hides this by
    setting ``LOCAL_RANK`` to the device index) and ranks sharing GPUs
    round robin. The list is extended with the cards the ranks use, entry
    ``r`` naming card ``r % count``, so that it names this rank's card at
    ``local``; a list long enough already is left as it is. CUDA read the
    variable when it started, so this process's devices do not change.

    Args:
        local (int): This rank's ``LOCAL_RANK``.
        count (int): GPUs this process sees.
    """
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    ids = visible.split(',')[:count] if visible else [
        str(i) for i in range(count)
    ]
    if count <= 0 or local < len(ids):
        return
    os.environ['CUDA_VISIBLE_DEVICES'] = ','.join(ids[r % len(ids)]
                                                  for r in range(local + 1))


def _check_torchrun_env(launcher: str) -> None:
    missing = [key for key in TORCHRUN_ENV_KEYS if key not in os.environ]
    if missing:
        raise ValueError(
            f"launcher={launcher!r} expects the environment that torchrun "
            f"sets, but {', '.join(missing)} is not set. Start training "
            'with `tools/dist_train.sh CONFIG NPROC` (or `torchrun '
            '--nproc_per_node NPROC tools/train.py CONFIG --launcher '
            "pytorch`), or use launcher='none' for a single process.")


def check_launch_environment(launcher: str,
                             argv: Optional[List[str]] = None) -> None:
    """Refuse launch set-ups that make process management fight.

    Raises ``ValueError`` with the fix when:

    - the process was started by torchrun (``WORLD_SIZE`` > 1) but
      ``launcher='none'``: every rank would train alone on all the data;
    - a Slurm step started this process as one of several tasks but
      ``launcher='none'``, for the same reason;
    - a torchrun worker or an ``srun`` task spawned this process with
      ``multiprocessing`` and it now wants to join the process group
      itself: two layers of process management (the OpenPCDet-style
      stall);
    - ``launcher='slurm'`` outside a Slurm job step, or under torchrun.

    (``LOCAL_RANK`` without the rest of torchrun's environment is refused
    by :func:`init_distributed`.)

    Warns about the deprecated ``torch.distributed.launch`` (it passes
    ``--local-rank`` on the command line; torchrun does not).

    Args:
        launcher (str): The configured launcher.
        argv (list[str], optional): Command line to inspect. Defaults to
            ``sys.argv``.
    """
    import multiprocessing
    import sys
    started_by = launched_by()
    world_size = int(os.environ.get('WORLD_SIZE', 1))
    tasks = int(os.environ.get('SLURM_NTASKS', 1))
    if launcher == 'none' and started_by == 'slurm' and tasks > 1:
        raise ValueError(
            f'This process is task {os.environ.get("SLURM_PROCID")} of '
            f'{tasks} of a Slurm job step, but launcher=\'none\': every '
            'task would train alone on the whole dataset. Pass --launcher '
            'slurm (tools/slurm_train.sh does), or start one task.')
    if launcher == 'none' and world_size > 1:
        raise ValueError(
            f'This process was started by a distributed launcher '
            f"(WORLD_SIZE={world_size}, RANK={os.environ.get('RANK')}) but "
            "launcher='none': every rank would train alone on the whole "
            'dataset. Pass --launcher pytorch (tools/dist_train.sh does), '
            'or run a single process without torchrun.')
    # A launcher's own marks (not WORLD_SIZE, which our rank launcher and
    # any env:// launcher set for their ranks too).
    manager = ('torchrun' if 'TORCHELASTIC_RUN_ID' in os.environ else
               'srun' if started_by == 'slurm' else None)
    if (launcher != 'none' and manager is not None
            and multiprocessing.parent_process() is not None):
        raise ValueError(
            'Two layers of process management: this process was started '
            f'with multiprocessing (spawn/fork) by a rank that {manager} '
            f'already launched. Let {manager} start every rank '
            '(tools/dist_train.sh CONFIG NPROC, tools/slurm_train.sh) and '
            'remove the mp.spawn/Process call, or run that script without '
            f'{manager}.')
    if launcher == 'slurm' and started_by != 'slurm':
        raise ValueError(
            "launcher='slurm' needs a task of a Slurm job step (srun sets "
            'SLURM_STEP_ID and SLURM_PROCID), but this process was started '
            f'by {started_by}. Run it under srun (tools/slurm_train.sh '
            "PARTITION JOB CONFIG WORK_DIR), or use --launcher pytorch "
            'with tools/dist_train.sh.')
    argv = sys.argv if argv is None else argv
    if any(a.startswith(('--local-rank', '--local_rank')) for a in argv):
        print_log(
            '--local-rank on the command line means the deprecated '
            'torch.distributed.launch started this process; use torchrun '
            '(tools/dist_train.sh) instead.',
            logger='current',
            level=30)


def gloo_exit_grace_s() -> float:
    """The exit grace in seconds: ``MMDDP_EXT_GLOO_EXIT_GRACE_S`` when set,
    else :data:`GLOO_EXIT_GRACE_S`.

    Raises:
        ValueError: The variable is set but is not a finite number >= 0
            (``inf`` would make ``time.sleep`` fail at exit). Raised
            when the grace is registered, at process-group creation, so a
            typo stops the run before training rather than at its exit.
    """
    value = os.environ.get(GLOO_EXIT_GRACE_ENV, '').strip()
    if not value:
        return GLOO_EXIT_GRACE_S
    try:
        grace = float(value)
    except ValueError:
        grace = -1.0
    if not (math.isfinite(grace) and grace >= 0):
        raise ValueError(
            f'{GLOO_EXIT_GRACE_ENV}={value!r} is not a finite number of '
            f'seconds >= 0. Set it to e.g. {GLOO_EXIT_GRACE_S} (the '
            'default), or 0 to switch the gloo exit grace off.')
    return grace


def _gloo_exit_grace() -> None:
    """The atexit handler of :func:`release_gloo_work_before_exit`."""
    grace = gloo_exit_grace_s()
    if grace > 0:
        time.sleep(grace)


def release_gloo_work_before_exit() -> None:
    """Let gloo's worker threads drop finished collectives before Python
    finalises, so that a rank does not abort at exit.

    Every gloo collective keeps the calling thread's state, which holds a
    Python object, and the worker thread that ran it often drops the last
    reference just after the caller saw it complete, for which it needs
    the GIL. When the main thread keeps the GIL from then until the
    interpreter finalises (a script that ends right after its last
    collective: a summary ``all_gather_object``, a barrier, DDP's last
    all-reduce), the worker gets the GIL only during finalisation, Python
    ends the thread, and C++ aborts the process: ``terminate called
    without an active exception``, SIGABRT, exit code -6 after training
    finished.
    ``destroy_process_group`` does not help, because gloo joins its
    threads only when the last reference to the group goes, and DDP still
    holds one. Measured in a 2-rank loop under torchrun: 9 aborts in about
    190 runs without this, none in 100 with it.

    The fix is an exit handler that waits :data:`GLOO_EXIT_GRACE_S`
    seconds (``MMDDP_EXT_GLOO_EXIT_GRACE_S`` overrides it) with the GIL
    released, while the interpreter is still whole, so those threads can
    finish. It is registered once per process, by whatever creates a gloo
    group here (the default group, side groups).

    Raises:
        ValueError: ``MMDDP_EXT_GLOO_EXIT_GRACE_S`` is not a number >= 0.
    """
    global _exit_grace_registered
    gloo_exit_grace_s()  # a malformed override fails here, not at exit
    if not _exit_grace_registered:
        atexit.register(_gloo_exit_grace)
        _exit_grace_registered = True


def _rendezvous_store(init_method: str, rank: int, world_size: int,
                      timeout: datetime.timedelta) -> torch_dist.Store:
    """The launch's store, as ``init_process_group`` would make it; a port
    another process holds is named, with how to choose another."""
    try:
        store, _, _ = next(
            torch_dist.rendezvous(
                init_method, rank, world_size, timeout=timeout))
    except RuntimeError as error:
        if 'EADDRINUSE' not in str(error):
            raise
        raise RuntimeError(
            f'mmddp_ext: rank {rank} cannot host the rendezvous on port '
            f"{os.environ.get('MASTER_PORT')} of "
            f"{os.environ.get('MASTER_ADDR')}: another process (a job "
            'sharing the node, a service) holds it. Choose another port: '
            'env_cfg.dist_cfg.port or MASTER_PORT for --launcher slurm, '
            'PORT=... for tools/dist_train.sh.') from error
    return store


_inits = 0


def _launch_attempt() -> str:
    """Store keys of this process group's creation: one per torchrun
    restart and Slurm requeue (torchrun's agent keeps its store across
    restarts), and per creation in this process."""
    global _inits
    _inits += 1
    restarts = '.'.join(
        os.environ.get(key, '0')
        for key in ('TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT'))
    return f'mmddp_ext/backend/{restarts}/{_inits}'


def init_distributed(launcher: str,
                     backend: Optional[str] = None,
                     timeout: Optional[float] = None,
                     port: Optional[int] = None,
                     **kwargs) -> str:
    """Initialise the default process group on CPU or GPU.

    Replaces ``mmengine.dist.init_dist`` for ``launcher='pytorch'`` and
    ``'slurm'``: it differs in choosing gloo when NCCL cannot run, which
    the ranks agree on in the rendezvous store before the group exists
    (:func:`count_gpus_shared`, :func:`decide_backend`), in setting a CUDA
    device only when one exists and, under Slurm, in the rendezvous
    (:func:`~mmddp_ext.launch.environments.export_slurm_rendezvous`: the
    master from the node list without ``scontrol``, a port per job).
    ``'mpi'`` is delegated to MMEngine, which needs CUDA.

    Args:
        launcher (str): ``'pytorch'``, ``'slurm'`` or ``'mpi'``.
        backend (str, optional): Requested backend; see
            :func:`decide_backend`. Defaults to None.
        timeout (float, optional): Collective timeout in seconds.
            Defaults to None, meaning ``DEFAULT_COLLECTIVE_TIMEOUT_S``.
        port (int, optional): ``env_cfg.dist_cfg.port``: the rendezvous
            port of a Slurm launch, as MMEngine reads it (torchrun chose
            its own port already, so it is ignored there, with a
            warning). Defaults to None.
        **kwargs: Passed to ``torch.distributed.init_process_group``
            unchanged, but for an ``init_method`` or ``store``: the
            rendezvous through which the ranks agree on the backend first.

    Returns:
        str: The backend in use.
    """
    if launcher not in SUPPORTED_LAUNCHERS:
        raise ValueError(
            f'launcher must be one of {SUPPORTED_LAUNCHERS} for distributed '
            f"training, but got {launcher!r}. Use launcher='none' for a "
            'single process.')
    timeout = DEFAULT_COLLECTIVE_TIMEOUT_S if timeout is None else timeout
    if launcher == 'mpi':
        if visible_gpu_count() == 0:
            raise ValueError(
                f'launcher={launcher!r} needs CUDA in MMEngine, and none is '
                "available. On CPU use launcher='pytorch' through "
                "`tools/dist_train.sh CONFIG NPROC`, or launcher='slurm' "
                'under srun (tools/slurm_train.sh).')
        from mmengine.dist import init_dist
        if port is not None:
            kwargs['port'] = port
        init_dist(
            launcher, backend=backend or 'nccl', timeout=timeout, **kwargs)
        return torch_dist.get_backend()

    check_launch_environment(launcher)
    if launcher == 'slurm':
        export_slurm_rendezvous(port)
    else:
        _check_torchrun_env(launcher)
        if port is not None:
            print_log(
                f'env_cfg.dist_cfg.port={port} is ignored: torchrun chose '
                f"the rendezvous port already (MASTER_PORT="
                f"{os.environ['MASTER_PORT']}; tools/dist_train.sh takes "
                'PORT=...).',
                logger='current',
                level=logging.WARNING)
    kwargs['timeout'] = datetime.timedelta(seconds=timeout)
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    device = rank_device()
    if device.type == 'cuda':
        torch.cuda.set_device(device)  # CUDA starts here
        index_cards_by_local_rank(local_rank(), visible_gpu_count())
    store = kwargs.pop('store', None)
    if store is None:
        store = _rendezvous_store(
            kwargs.pop('init_method', None) or 'env://', rank, world_size,
            kwargs['timeout'])
    store.set_timeout(kwargs['timeout'])
    without_gpu = sharing = 0
    if backend in (None, 'nccl'):  # the config says the same on every rank
        without_gpu, sharing = count_gpus_shared(store, world_size,
                                                 gpu_identity(device),
                                                 _launch_attempt())
    chosen, reason = decide_backend(backend, world_size, without_gpu, sharing)
    torch_dist.init_process_group(
        backend=chosen,
        store=store,
        rank=rank,
        world_size=world_size,
        **kwargs)
    if chosen == 'gloo':
        release_gloo_work_before_exit()
    if launcher == 'slurm':
        # srun ends the other tasks of a failed one only with
        # --kill-on-bad-exit=1; torchrun always does.
        start_peer_watchdog(default_store(), torch_dist.get_rank(),
                            torch_dist.get_world_size(),
                            os.environ['MASTER_ADDR'])
    # On a CPU-only machine gloo is the documented stand-in for nccl; with
    # GPUs, not getting the requested backend deserves a warning.
    switched = backend not in (None, chosen) and visible_gpu_count() > 0
    rendezvous = (f" through {os.environ['MASTER_ADDR']}:"
                  f"{os.environ['MASTER_PORT']} (Slurm job "
                  f"{os.environ.get('SLURM_JOB_ID')}, task "
                  f"{os.environ.get('SLURM_PROCID')})"
                  if launcher == 'slurm' else '')
    print_log(
        f'mmddp_ext: {chosen} process group, rank {torch_dist.get_rank()}/'
        f'{torch_dist.get_world_size()} on {device} ({reason}){rendezvous}, '
        f"collective timeout {kwargs['timeout'].total_seconds():.0f}s" +
        (f'; env_cfg.dist_cfg.backend={backend!r} cannot run here'
         if switched else ''),
        logger='current',
        level=logging.WARNING if switched else logging.INFO)
    return chosen
