"""Where the ranks of a run come from: torchrun, a Slurm job step, or
plain processes.

Every launcher describes the ranks in its own variables. torchrun sets
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT``; ``srun`` sets ``SLURM_PROCID``,
``SLURM_NTASKS``, ``SLURM_LOCALID``, the step's node list and tasks per
node, and no rendezvous at all. :func:`export_slurm_rendezvous` turns a
Slurm task's variables into torchrun's, so that the process group, the
device choice and every check downstream read one set of names.

The rendezvous differs from MMEngine's ``_init_dist_slurm`` in two ways:

- ``MASTER_ADDR`` is the first host of the step's node list, expanded here
  (:func:`expand_hostlist`) instead of by ``scontrol show hostnames``,
  which containers without Slurm's tools lack (mmcv #700);
- ``MASTER_PORT`` is derived from the job and step ids
  (:func:`slurm_port`) instead of a fixed 29500, so two jobs sharing a
  node never collide (mmengine #169), while every task of one step, on
  any node, computes the same port without talking to the others (a free
  port searched per rank differs from rank to rank, mmcv #2309).

A user's ``env_cfg.dist_cfg.port``, then ``MASTER_PORT``, win over the
derived port; a user's ``MASTER_ADDR`` wins over the node list. A first
node whose name does not resolve is reached at its ``NodeAddr``
(:func:`node_address`).
"""
import os
import re
import shutil
import socket
import subprocess
from typing import Dict, List, Mapping, Optional

# Ports below Linux's ephemeral range (32768-60999), above the well-known
# and registered services most nodes run, and clear of torch's 29500.
SLURM_PORT_BASE = 12000
SLURM_PORT_SPAN = 17000
# Step ids are small (0, 1, ...) except the batch and extern steps.
_STEP_SLOTS = 16

SLURM_TASK_KEYS = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID')
# What makes launched_by() name a launcher other than the caller's own.
_LAUNCHER_IDENTITY_KEYS = ('TORCHELASTIC_RUN_ID', 'SLURM_STEP_ID',
                           'SLURM_PROCID')


def launched_by(env: Optional[Mapping[str, str]] = None) -> str:
    """Which launcher started this process: ``'torchrun'`` (torchrun or
    ``torch.distributed.launch``: ``TORCHELASTIC_RUN_ID``), ``'slurm'`` (a
    task of an ``srun`` step: ``SLURM_STEP_ID`` and ``SLURM_PROCID``; a
    batch script's own shell is no task), ``'torchrun'`` again for any
    other launcher of ``WORLD_SIZE`` > 1 ranks, else ``'plain'``. torchrun
    inside ``srun`` (``tools/dist_train.sh`` under Slurm) counts as
    torchrun: it set the ranks."""
    env = os.environ if env is None else env
    if 'TORCHELASTIC_RUN_ID' in env:
        return 'torchrun'
    if 'SLURM_STEP_ID' in env and 'SLURM_PROCID' in env:
        return 'slurm'
    if int(env.get('WORLD_SIZE', 1)) > 1:
        return 'torchrun'
    return 'plain'


def without_outer_launcher(env: Mapping[str, str]) -> Dict[str, str]:
    """``env`` without the variables that say torchrun or ``srun`` started
    the process: for ranks that a launcher of ours starts inside a launched
    process (the doctor's probe and the tests' ranks, run from a Slurm job
    step or a torchrun worker), which are that launcher's ranks, not the
    outer one's."""
    return {
        key: value
        for key, value in env.items() if key not in _LAUNCHER_IDENTITY_KEYS
    }


def expand_hostlist(text: str) -> List[str]:
    """Expand a Slurm host list: ``'gpu[01-03,07],login-[2-3]x'`` ->
    ``['gpu01', 'gpu02', 'gpu03', 'gpu07', 'login-2x', 'login-3x']``.
    Several bracket groups in one name multiply out, and ranges keep
    their zero padding, as ``scontrol show hostnames`` prints them.

    Raises:
        ValueError: The text is not a host list (unbalanced brackets, a
            range whose end precedes its start).
    """
    hosts = []
    for name in _split_top_level(text.strip()):
        hosts.extend(_expand_name(name))
    return hosts


def _split_top_level(text: str) -> List[str]:
    """Split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {'[': 1, ']': -1}.get(char, 0)
        if depth not in (0, 1):
            raise ValueError(f'host list {text!r}: unbalanced brackets')
        if char == ',' and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f'host list {text!r}: unbalanced brackets')
    parts.append(text[start:])
    return [part for part in parts if part]


def _expand_name(name: str) -> List[str]:
    match = re.search(r'\[([^\]]*)\]', name)
    if match is None:
        if ']' in name:
            raise ValueError(f'host name {name!r}: unbalanced brackets')
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    return [
        head + value + rest for value in _expand_ranges(match.group(1), name)
        for rest in _expand_name(tail)
    ]


def _expand_ranges(body: str, name: str) -> List[str]:
    values = []
    for item in body.split(','):
        low, _, high = item.partition('-')
        if not low.isdigit() or (high and not high.isdigit()):
            raise ValueError(f'host name {name!r}: {item!r} is not a number '
                             'or a range of numbers')
        high = high or low
        if int(high) < int(low):
            raise ValueError(f'host name {name!r}: range {item!r} ends '
                             'before it starts')
        values.extend(
            str(n).zfill(len(low)) for n in range(int(low),
                                                  int(high) + 1))
    return values


def expand_tasks_per_node(text: str) -> List[int]:
    """``SLURM_TASKS_PER_NODE`` as one count per node: ``'2(x3),1'`` ->
    ``[2, 2, 2, 1]``."""
    counts = []
    for item in text.split(','):
        match = re.fullmatch(r'(\d+)(?:\(x(\d+)\))?', item.strip())
        if match is None:
            raise ValueError(f'tasks per node {text!r}: {item!r} is not '
                             "'N' or 'N(xK)'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def slurm_port(job_id: str, step_id: str = '0') -> int:
    """The rendezvous port of a job step: the same on every task of the
    step, different for jobs whose ids differ by less than
    :data:`SLURM_PORT_SPAN` / 16 and for the concurrent steps of one job."""
    step = int(step_id) if str(step_id).isdigit() else 0
    slot = int(job_id) * _STEP_SLOTS + step % _STEP_SLOTS
    return SLURM_PORT_BASE + slot % SLURM_PORT_SPAN


def _required(env: Mapping[str, str], key: str) -> str:
    value = env.get(key)
    if value is None:
        raise ValueError(
            f"launcher='slurm' needs the variables srun gives each task, "
            f'but {key} is not set. Start training with `srun ... python '
            'tools/train.py CONFIG --launcher slurm` (tools/slurm_train.sh '
            'does) inside a Slurm allocation, or use tools/dist_train.sh '
            "with launcher='pytorch'.")
    return value


def slurm_rendezvous(env: Optional[Mapping[str, str]] = None,
                     port: Optional[int] = None) -> Dict[str, str]:
    """torchrun's variables for this Slurm task, derived from Slurm's.

    Args:
        env (Mapping, optional): The environment. Defaults to
            ``os.environ``.
        port (int, optional): ``env_cfg.dist_cfg.port``; wins over
            ``MASTER_PORT`` and the job-id port. Defaults to None.

    Returns:
        dict: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
        ``MASTER_PORT`` and, when the step says how many of its tasks run
        on this node, ``LOCAL_WORLD_SIZE``.

    Raises:
        ValueError: A variable every ``srun`` task has is missing (not
            started by ``srun``), or the node list cannot be read.
    """
    env = os.environ if env is None else env
    rank, world, local = (_required(env, key) for key in SLURM_TASK_KEYS)
    nodes = env.get('SLURM_STEP_NODELIST') or _required(
        env, 'SLURM_JOB_NODELIST')
    hosts = expand_hostlist(nodes)
    result = dict(
        RANK=rank,
        WORLD_SIZE=world,
        LOCAL_RANK=local,
        MASTER_ADDR=env.get('MASTER_ADDR') or hosts[0])
    if port is not None:
        result['MASTER_PORT'] = str(port)
    else:
        result['MASTER_PORT'] = env.get('MASTER_PORT') or str(
            slurm_port(
                _required(env, 'SLURM_JOB_ID'), env.get('SLURM_STEP_ID', '0')))
    local_size = _local_world_size(env, hosts)
    if local_size is not None:
        result['LOCAL_WORLD_SIZE'] = str(local_size)
    return result


def _local_world_size(env: Mapping[str, str],
                      hosts: List[str]) -> Optional[int]:
    """Tasks of this step on this node, from the step's tasks per node and
    this node's place in its node list; None where Slurm does not say."""
    per_node = (
        env.get('SLURM_STEP_TASKS_PER_NODE')
        or env.get('SLURM_TASKS_PER_NODE'))
    node = env.get('SLURMD_NODENAME')
    if not per_node or node not in hosts:
        return None
    counts = expand_tasks_per_node(per_node)
    index = hosts.index(node)
    return counts[index] if index < len(counts) else None


def node_address(name: str) -> str:
    """An address at which the ranks reach Slurm node ``name``: the name
    when it resolves (DNS, ``/etc/hosts``), else the node's ``NodeAddr``
    (``scontrol show node``), which ``slurm.conf`` sets for nodes whose
    names do not resolve.

    Raises:
        ValueError: The name does not resolve and ``scontrol`` cannot say
            the node's address; the message says to set ``MASTER_ADDR``.
    """
    try:
        socket.getaddrinfo(name, None)
        return name
    except socket.gaierror as error:
        unresolved = error
    scontrol = shutil.which('scontrol')
    found, why = None, 'is not on PATH'
    if scontrol:
        try:
            result = subprocess.run([scontrol, 'show', 'node', '-o', name],
                                    capture_output=True,
                                    text=True,
                                    timeout=30)
            found = re.search(r'\bNodeAddr=(\S+)', result.stdout)
            why = f'printed no NodeAddr ({result.stderr.strip()[:200]})'
        except (OSError, subprocess.TimeoutExpired) as error:
            why = f'failed ({error})'
    if found:
        return found.group(1)
    raise ValueError(
        f"launcher='slurm': the step's first node, {name!r}, hosts the "
        f'rendezvous, but its name does not resolve ({unresolved}) and '
        f'scontrol show node {why}. Set MASTER_ADDR to its address before '
        'srun (export MASTER_ADDR=...), or make the name resolve.')


def export_slurm_rendezvous(port: Optional[int] = None) -> Dict[str, str]:
    """Set torchrun's variables in ``os.environ`` from Slurm's (see
    :func:`slurm_rendezvous`; the first node at :func:`node_address`) and
    return them. Slurm's task variables win over stale ones
    (``tools/train.py`` sets ``LOCAL_RANK=0`` when none is set)."""
    values = slurm_rendezvous(port=port)
    if not os.environ.get('MASTER_ADDR'):
        values['MASTER_ADDR'] = node_address(values['MASTER_ADDR'])
    os.environ.update(values)
    return values
