"""The next epoch of an iteration-based training loop without MMEngine's
two-second pause, where no worker process can deadlock."""
from typing import Any

from mmengine.runner import IterBasedTrainLoop
from torch.utils.data import DataLoader


class WorkerlessEpochIterator:
    """Endless iterator over a dataloader that runs in the main process
    (``num_workers=0``), replacing ``IterBasedTrainLoop``'s iterator.

    MMEngine's iterator sleeps 2 s at every epoch end, against a deadlock
    of worker processes being restarted; with no worker processes there is
    nothing to wait for, and a small dataset pays the pause every few
    iterations. The sampler's epoch advances as in MMEngine's.

    Args:
        dataloader (DataLoader): The training dataloader; its
            ``num_workers`` must be 0.
    """

    def __init__(self, dataloader: DataLoader) -> None:
        if dataloader.num_workers != 0:
            raise ValueError(
                'WorkerlessEpochIterator needs a dataloader without worker '
                f'processes, but num_workers={dataloader.num_workers}; keep '
                "MMEngine's iterator (its pause guards the workers).")
        self._dataloader = dataloader
        self._iterator = iter(dataloader)
        self._epoch = 0

    def __iter__(self) -> 'WorkerlessEpochIterator':
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            self._epoch += 1
            _set_sampler_epoch(self._dataloader, self._epoch)
            self._iterator = iter(self._dataloader)
            return next(self._iterator)


def _set_sampler_epoch(dataloader: DataLoader, epoch: int) -> None:
    """``set_epoch`` of the dataloader's sampler, or of its batch sampler's
    sampler, where it has one (MMEngine's ``DefaultSampler`` does)."""
    batch_sampler = getattr(dataloader, 'batch_sampler', None)
    for sampler in (getattr(dataloader, 'sampler', None),
                    getattr(batch_sampler, 'sampler', None)):
        if hasattr(sampler, 'set_epoch'):
            sampler.set_epoch(epoch)
            return


def without_epoch_pause(loop: Any) -> Any:
    """``loop`` with :class:`WorkerlessEpochIterator` when it is an
    ``IterBasedTrainLoop`` whose dataloader has no worker processes; any
    other loop as it is."""
    if (isinstance(loop, IterBasedTrainLoop)
            and getattr(loop.dataloader, 'num_workers', None) == 0):
        loop.dataloader_iterator = WorkerlessEpochIterator(loop.dataloader)
    return loop
