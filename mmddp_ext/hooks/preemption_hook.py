"""``PreemptionHook``: a signal from the cluster becomes a checkpoint at an
iteration boundary every rank agrees on, then a requeue or one line that
says how to resume."""
import logging
import os
import os.path as osp
import shutil
import signal
import subprocess
from typing import Dict, Optional, Sequence, Union

from mmengine.dist import get_rank, is_distributed
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..launch.side_channel import SideChannel
from ..utils.text import log_on_every_rank

REQUEUE_VALUES = ('auto', True, False)
REQUEUE_TIMEOUT_S = 60
_RESUME_HINT = ('to resume, run the same command with --resume (a requeued '
                'or restarted run of ExtRunner resumes by itself)')


def _signal_number(name: Union[str, int], key: str) -> int:
    if isinstance(name, int):
        return int(signal.Signals(name))
    try:
        return int(
            signal.Signals[name if name.startswith('SIG') else f'SIG{name}'])
    except KeyError:
        raise ValueError(
            f'PreemptionHook {key}: {name!r} is not a signal name; use names '
            "such as 'SIGUSR1', 'SIGUSR2', 'SIGTERM'.") from None


class Preempted(SystemExit):
    """Ends the run after the checkpoint a signal asked for; its code is
    128 + the signal's number, as a shell reports a process a signal
    ended."""


@HOOKS.register_module()
class PreemptionHook(Hook):
    """Checkpoint on the signal a cluster sends before it stops a job,
    at the same iteration on every rank, and requeue the job.

    Slurm sends ``SIGUSR1`` ahead of the time limit when the job asks for it
    (``#SBATCH --signal=USR1@120``) and ``SIGTERM`` on a preemption, at
    the time limit and on ``scancel``, then ``SIGKILL`` after ``KillWait``
    (30 s by default). On one of :attr:`signals`, every rank finishes its
    iteration; after it, the ranks agree on a side channel (each
    iteration, one small all-reduce outside DDP's group) that one of them
    was signalled, rank 0 writes a checkpoint, completely, under a
    temporary name then renamed, and points ``last_checkpoint`` at it.
    Then, for a signal in :attr:`requeue_signals` inside a Slurm job, rank
    0 runs ``scontrol requeue``: the job starts again from the top of its
    batch script and ``ExtRunner`` resumes it from that checkpoint by
    itself. Otherwise every rank logs how to resume. The run ends with
    code 128 + the signal's number.

    The agreement is a collective: ranks whose DDP has already diverged
    (one waiting in a backward its peers never run, which
    ``RankConsistencyHook`` reports first) wait at it until the collective
    timeout, whose error names each rank's phase, where plain DDP would
    raise one iteration later. A collective is what keeps the stop exact
    when ranks drift apart, as they may by several iterations under
    gradient accumulation.

    A second signal during the save only repeats the request; the file is
    renamed into place only once whole, so a ``SIGKILL`` during the save
    leaves the previous checkpoint as the latest.

    ``ExtRunner`` registers it (``mmddp_ext_cfg.preemption``).

    Args:
        signals (Sequence[str]): Signals that checkpoint and stop.
            Defaults to ``('SIGUSR1', 'SIGTERM')``.
        requeue_signals (Sequence[str]): Those of ``signals`` after which
            the job requeues itself. Defaults to ``('SIGUSR1',)``: Slurm's
            early warning, which the job asked for; ``SIGTERM`` also comes
            from ``scancel``, which means stop.
        requeue (bool | str): ``'auto'`` requeues inside a Slurm job
            (``SLURM_JOB_ID``) where ``scontrol`` exists; True also
            refuses to start training where it cannot; False never
            requeues. Defaults to ``'auto'``.
        filename_tmpl (str): The checkpoint's name in the work dir, from
            the number of iterations trained. Defaults to
            ``'iter_{}.pth'``, as MMEngine's ``CheckpointHook``.
    """

    priority = 'LOWEST'  # after every other hook of the iteration

    def __init__(self,
                 signals: Sequence[str] = ('SIGUSR1', 'SIGTERM'),
                 requeue_signals: Sequence[str] = ('SIGUSR1', ),
                 requeue: Union[bool, str] = 'auto',
                 filename_tmpl: str = 'iter_{}.pth') -> None:
        if isinstance(signals, str) or isinstance(requeue_signals, str):
            raise TypeError(
                'PreemptionHook signals and requeue_signals are sequences '
                "of names, e.g. signals=('SIGUSR1', 'SIGTERM').")
        self.signals = [_signal_number(s, 'signals') for s in signals]
        self.requeue_signals = [
            _signal_number(s, 'requeue_signals') for s in requeue_signals
        ]
        if not set(self.requeue_signals) <= set(self.signals):
            raise ValueError(
                'PreemptionHook requeue_signals must be among signals '
                f'({list(signals)}), but got {list(requeue_signals)}.')
        if requeue not in REQUEUE_VALUES:
            raise ValueError(
                f'PreemptionHook requeue must be one of {REQUEUE_VALUES}, '
                f'but got {requeue!r}.')
        self.requeue = requeue
        self.filename_tmpl = filename_tmpl
        self.received = 0
        self._previous: Dict[int, object] = {}
        self._channel: Optional[SideChannel] = None
        self._iteration = 0
        self._pid = os.getpid()

    # ------------------------------------------------------------ signals
    def _on_signal(self, signum: int, frame) -> None:
        if os.getpid() != self._pid:
            # A dataloader worker forked with this handler: the signal is
            # the training process's to act on.
            return
        again = ' again' if self.received else ''
        self.received = self.received or signum
        log_on_every_rank(
            f'PreemptionHook: rank {get_rank()} received '
            f'{signal.Signals(signum).name}{again} during iteration '
            f'{self._iteration + 1}; the run checkpoints at the end of the '
            'iteration every rank is in.', logging.WARNING)

    def before_train(self, runner) -> None:
        if self.requeue is True and not self._can_requeue():
            raise ValueError(
                'PreemptionHook requeue=True needs a Slurm job '
                '(SLURM_JOB_ID) and scontrol on PATH; this process has '
                f"SLURM_JOB_ID={os.environ.get('SLURM_JOB_ID')!r}, scontrol "
                f"{shutil.which('scontrol') or 'not found'}. Use "
                "requeue='auto' (requeue where possible) or False.")
        self._pid = os.getpid()
        for signum in self.signals:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        if is_distributed():
            self._channel = SideChannel.open('PreemptionHook')

    def after_train(self, runner) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    # -------------------------------------------------------------- checks
    def before_train_iter(self, runner, batch_idx: int, data_batch=None):
        self._iteration = runner.iter

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        self._stop_if_signalled(runner, runner.iter + 1, by_epoch=False)

    def after_val_epoch(self, runner, metrics=None) -> None:
        """A signal during an evaluation between epochs: the checkpoint
        continues at the start of the next epoch."""
        if getattr(runner, '_in_train', False) and runner.epoch > 0:
            self._stop_if_signalled(
                runner,
                runner.iter,
                by_epoch=None,
                meta=dict(epoch=runner.epoch, iter=runner.iter))

    def _agreed_signal(self) -> int:
        """The signal a rank received (the smallest number where several
        did), 0 for none, the same on every rank."""
        received = [self.received]
        if self._channel is not None:
            received = [r for [r] in self._channel.all_gather_ints(received)]
        received = [r for r in received if r]
        return min(received) if received else 0

    def _stop_if_signalled(self,
                           runner,
                           trained: int,
                           by_epoch: Optional[bool],
                           meta: Optional[dict] = None) -> None:
        signum = self._agreed_signal()
        if not signum:
            return
        name = signal.Signals(signum).name
        path = self._save(runner, trained, by_epoch, meta)
        requeue = (
            signum in self.requeue_signals and self.requeue is not False
            and self._can_requeue())
        # Said before the requeue: Slurm ends the job's steps at once, and
        # what the tasks print after it may never reach the job's log.
        then = (f'requeueing job {os.environ.get("SLURM_JOB_ID")}: it '
                'starts again and resumes from this checkpoint by itself'
                if requeue else _RESUME_HINT)
        log_on_every_rank(
            f'PreemptionHook: {name}: rank {runner.rank} stops after '
            f'iteration {trained} (epoch {runner.epoch}); checkpoint {path} '
            f'written; {then}.', logging.WARNING)
        if requeue and not self._requeue(runner):
            log_on_every_rank(f'PreemptionHook: not requeued; {_RESUME_HINT}.',
                              logging.WARNING)
        raise Preempted(128 + signum)

    def _save(self, runner, trained: int, by_epoch: Optional[bool],
              meta: Optional[dict]) -> str:
        filename = self.filename_tmpl.format(trained)
        kwargs = dict(meta=meta) if meta else dict(by_epoch=by_epoch)
        runner.save_checkpoint(runner.work_dir, filename, **kwargs)
        path = osp.join(runner.work_dir, filename)
        if runner.rank == 0:
            _write_atomically(
                osp.join(runner.work_dir, 'last_checkpoint'), path)
        if self._channel is not None:  # every rank knows it is on disk
            self._channel.all_gather_ints([1])
        return path

    # ------------------------------------------------------------- requeue
    def _can_requeue(self) -> bool:
        return bool(
            os.environ.get('SLURM_JOB_ID') and shutil.which('scontrol'))

    def _requeue(self, runner) -> bool:
        """``scontrol requeue`` the job on rank 0, after the checkpoint is
        on disk; whether it was requeued, on every rank."""
        done = True
        if runner.rank == 0:
            done = _scontrol_requeue(os.environ['SLURM_JOB_ID'])
        if self._channel is not None:
            done = all(d for [d] in self._channel.all_gather_ints([done]))
        return done


def _write_atomically(path: str, text: str) -> None:
    partial = f'{path}.partial'
    with open(partial, 'w') as f:
        f.write(text)
    os.replace(partial, path)


def _scontrol_requeue(job_id: str) -> bool:
    # An array task's own id: SLURM_JOB_ID names the task, not the array.
    command = ['scontrol', 'requeue', job_id]
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=REQUEUE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        print_log(
            f'PreemptionHook: {" ".join(command)} failed ({error}).',
            logger='current',
            level=logging.ERROR)
        return False
    if result.returncode != 0:
        print_log(
            f'PreemptionHook: {" ".join(command)} failed (exit '
            f'{result.returncode}: {result.stderr.strip()[:300]}); the job '
            'is not requeued (a job started with --no-requeue, or outside '
            'sbatch, cannot be).',
            logger='current',
            level=logging.ERROR)
        return False
    print_log(
        f'PreemptionHook: {" ".join(command)}: the job is requeued.',
        logger='current',
        level=logging.WARNING)
    return True
