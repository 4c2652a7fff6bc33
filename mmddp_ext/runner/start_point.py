"""Where a training run starts: one rule for every launch, restart and
resume.

A run continues from the newest of its own latest checkpoint and what it
was started with (``load_from``, or the checkpoint ``--resume`` named).
So a fine-tune that torchrun restarts before its first checkpoint loads
its ``load_from`` again, and one restarted after a checkpoint resumes from
that checkpoint and does not load ``load_from`` on top.

The first attempt of a launch records its start in the work dir
(:data:`RECORD`), with the work dir's latest checkpoint at that moment, so
that a restart tells the checkpoints this run wrote from those an earlier
run left there, and so that a later ``--resume`` (MMDetection's clears
``load_from``) still finds the weights the run started from.

:func:`choose_start` is the rule, free of I/O; ``ExtRunner.load_or_resume``
feeds it and applies what it returns.
"""
import glob
import os
import os.path as osp
import zipfile
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional, Tuple

RECORD = 'mmddp_ext_start.json'
RESUME_VALUES = (False, True, 'auto')

# (path, mtime in ns, size) of a checkpoint: a file rewritten under the same
# name is another checkpoint.
Stamp = List


@dataclass(frozen=True)
class StartPoint:
    """What a run loads before its first step.

    Args:
        action (str): ``'resume'`` (weights, optimizer, schedulers, loop
            position and message hub), ``'load'`` (weights only; training
            starts at iteration 0) or ``'scratch'`` (nothing).
        path (str, optional): The checkpoint; None for ``'scratch'``.
        why (str): The reason, for the log line.
        warn (bool): Whether the log line is a warning (a damaged
            checkpoint was passed over). Defaults to False.
    """
    action: str
    path: Optional[str]
    why: str
    warn: bool = False

    def describe(self) -> str:
        if self.action == 'resume':
            return f'resuming from {self.path}: {self.why}'
        if self.action == 'load':
            return (f'loading the weights of {self.path} (training starts at '
                    f'iteration 0): {self.why}')
        return f'training from freshly initialised weights: {self.why}'


RESTART_COUNT_KEYS = ('TORCHELASTIC_RESTART_COUNT', 'SLURM_RESTART_COUNT')


def restart_count() -> int:
    """How many times this launch started again: torchrun's restarts of
    its ranks plus Slurm's requeues of the job (a requeued job runs its
    batch script again, with the command it was submitted with)."""
    return sum(int(os.environ.get(key, 0) or 0) for key in RESTART_COUNT_KEYS)


def checkpoint_stamp(path: Optional[str]) -> Optional[Stamp]:
    """``[path, mtime_ns, size]`` of a local file (``[path, None, None]``
    for a path that is not one), None for no path."""
    if path is None:
        return None
    try:
        stat = os.stat(path)
    except OSError:
        return [path, None, None]
    return [path, stat.st_mtime_ns, stat.st_size]


def checkpoint_damage(path: str) -> Optional[str]:
    """What is wrong with the local checkpoint file ``path`` (None: nothing
    this can see), read from its size, its first bytes and its last ones
    only.

    ``torch.save`` writes a zip archive, whose directory is at its end: a
    file cut short (a node lost between the rename and the data reaching
    the disk, a copy that did not finish) starts as a zip and lacks it. A
    path with a scheme (``s3://``) is not checked.
    """
    if '://' in path:
        return None
    if not osp.isfile(path):
        return 'missing'
    if osp.getsize(path) == 0:
        return 'empty'
    with open(path, 'rb') as f:
        zipped = f.read(4) == b'PK\x03\x04'
    if zipped and not zipfile.is_zipfile(path):
        return 'cut short (its zip directory is missing)'
    return None


def newest_whole_checkpoint(
        directory: str, damaged: str,
        is_training_checkpoint: Callable[[str], bool]) -> Optional[str]:
    """The newest ``*.pth`` in ``directory`` (by modification time) other
    than ``damaged`` that is whole and holds training state, or None."""
    candidates = [
        path for path in glob.glob(osp.join(directory, '*.pth'))
        if osp.abspath(path) != osp.abspath(damaged)
    ]
    candidates.sort(key=lambda path: os.stat(path).st_mtime_ns, reverse=True)
    for path in candidates:
        if checkpoint_damage(path) is None and is_training_checkpoint(path):
            return path
    return None


def holds_training_state(checkpoint: dict) -> bool:
    """Whether ``Runner.resume`` can continue from ``checkpoint``: it reads
    the loop position from ``meta`` and restores the message hub, which
    MMEngine writes into every training checkpoint and published or
    converted weights lack."""
    meta = checkpoint.get('meta')
    return (isinstance(meta, dict) and 'iter' in meta and 'epoch' in meta
            and 'message_hub' in checkpoint)


def check_resume(resume) -> None:
    """Refuse a ``resume`` value the rule does not know."""
    if resume is None or isinstance(resume, bool) or resume == 'auto':
        return
    raise ValueError(
        f'resume must be one of {RESUME_VALUES}, but got {resume!r}. To '
        'resume from a given checkpoint, set resume=True and '
        'load_from=PATH (tools/train.py --resume PATH does that); '
        "resume='auto' (tools/train.py --resume) continues from the work "
        "dir's latest checkpoint, or starts from load_from.")


def _assume_training_checkpoint(path: str) -> bool:
    return True


def choose_start(
    resume,
    load_from: Optional[str],
    latest: Optional[Stamp],
    restart: int = 0,
    record: Optional[dict] = None,
    is_training_checkpoint: Callable[[str], bool] = _assume_training_checkpoint
) -> Tuple[StartPoint, Optional[dict]]:
    """The rule. Returns the start and the record to keep in the work dir
    (None: keep the one there).

    Args:
        resume (bool | str | None): The config's ``resume``. False/None: a
            new run, from ``load_from`` if set. ``'auto'``
            (``tools/train.py --resume``): the work dir's latest checkpoint,
            else ``load_from``. True: as MMEngine, resume from ``load_from``
            when it is a training checkpoint (``--resume PATH``); when it
            holds weights only (a pretrained model), or is unset, as
            ``'auto'``.
        load_from (str, optional): The config's ``load_from``.
        latest (list, optional): :func:`checkpoint_stamp` of the work dir's
            latest checkpoint.
        restart (int): :func:`restart_count`.
        record (dict, optional): The record found in the work dir.
        is_training_checkpoint (callable): Whether a path holds training
            state (:func:`holds_training_state`); asked only for
            ``resume=True`` with ``load_from`` set.
    """
    check_resume(resume)
    inputs = dict(resume=resume or False, load_from=load_from)
    if restart and record and record.get('inputs') == inputs:
        return _after_restart(record, latest), None
    start = _launch_start(inputs['resume'], load_from, latest, record,
                          is_training_checkpoint)
    weights = (record or {}).get('weights')
    if start.action == 'load':
        weights = start.path
    return start, dict(
        inputs=inputs, start=asdict(start), latest=latest, weights=weights)


def _after_restart(record: dict, latest: Optional[Stamp]) -> StartPoint:
    """A restart of the launch that wrote ``record``: its own latest
    checkpoint, if it wrote one since, else where it started."""
    if latest is not None and latest != record.get('latest'):
        return StartPoint('resume', latest[0],
                          'the latest checkpoint this run wrote')
    start = StartPoint(**record['start'])
    return StartPoint(
        start.action, start.path, 'this run has written no checkpoint yet, '
        f'so it starts again as it started: {start.why}')


def _launch_start(resume, load_from: Optional[str], latest: Optional[Stamp],
                  record: Optional[dict],
                  is_training_checkpoint: Callable[[str], bool]) -> StartPoint:
    if not resume:
        if load_from:
            return StartPoint('load', load_from,
                              'the load_from of a new run (resume is off)')
        return StartPoint('scratch', None, 'no load_from, and resume is off')
    note = ''
    if resume is True and load_from:
        if is_training_checkpoint(load_from):
            return StartPoint(
                'resume', load_from, 'resume=True with load_from, a '
                'training checkpoint (as --resume PATH)')
        note = ('load_from holds weights only (no training state to '
                'resume), so resume=True continues this run: ')
    if latest is not None:
        return StartPoint('resume', latest[0],
                          note + 'the latest checkpoint in the work dir')
    if load_from:
        return StartPoint(
            'load', load_from, note + 'no checkpoint in the work dir yet, so '
            'the run starts from load_from')
    weights = (record or {}).get('weights')
    if weights:
        return StartPoint(
            'load', weights, 'no checkpoint in the work dir yet and '
            "load_from is unset (MMDetection's --resume clears it): the "
            "weights this work dir's run started from, recorded in "
            f'{RECORD}')
    return StartPoint('scratch', None,
                      'no checkpoint in the work dir and no load_from')


def peek_is_training_checkpoint(path: str,
                                trusted: Optional[List[str]] = None) -> bool:
    """Load ``path`` on the CPU (through the safe loader) and tell whether
    it holds training state."""
    from mmengine.runner.checkpoint import _load_checkpoint

    from ..utils.checkpoint_safety import safe_checkpoint_loading
    with safe_checkpoint_loading(trusted):
        checkpoint = _load_checkpoint(path, map_location='cpu')
    return isinstance(checkpoint, dict) and holds_training_state(checkpoint)
