"""``ResumableIterBasedTrainLoop``: MMEngine's iteration loop that resumes
by skipping trained batches by index instead of loading them."""
import logging
import time
from typing import Any

from mmengine.logging import print_log
from mmengine.registry import LOOPS
from mmengine.runner import IterBasedTrainLoop
from mmengine.runner import loops as loops_module
from torch.utils.data import DataLoader

from .exact_resume import reseed_step

# MMEngine pauses this long at the end of each pass over the data when
# worker processes restart, against a deadlock; without workers there is
# nothing to wait for.
WORKER_RESTART_PAUSE_S = 2


class EndlessBatches:
    """Endless iterator over a dataloader whose batch sampler is a
    :class:`~mmddp_ext.datasets.ResumableBatchSampler`, replacing
    ``IterBasedTrainLoop``'s.

    Differs from MMEngine's ``_InfiniteDataloaderIterator`` in three ways:
    it creates the dataloader's iterator at the first batch, not when the
    loop is built (its workers would otherwise load the first batches of
    the run before a resume says where to start); :meth:`fast_forward`
    moves it to a position by index; and it pauses between passes only
    when worker processes restart. The sampler's epoch advances as in
    MMEngine's.

    Args:
        dataloader (DataLoader): The training dataloader.
    """

    def __init__(self, dataloader: DataLoader) -> None:
        self._dataloader = dataloader
        self._iterator = None
        self._epoch = 0
        self._answer_skips = 0

    def __iter__(self) -> 'EndlessBatches':
        return self

    def fast_forward(self, batches: int, iterations: int) -> None:
        """Continue after the first ``batches`` batches of the run; the
        next ``iterations`` calls of ``next``, with which
        ``IterBasedTrainLoop.run`` skips the iterations trained (as many
        as ``batches`` unless the world size or batch size changed),
        return None at once."""
        sampler = self._dataloader.batch_sampler
        self._epoch = sampler.fast_forward(batches)
        sampler.next_batch = batches
        self._answer_skips = iterations

    def __next__(self) -> Any:
        if self._answer_skips:
            self._answer_skips -= 1
            return None
        if self._iterator is None:
            self._iterator = iter(self._dataloader)
        try:
            return next(self._iterator)
        except StopIteration:
            self._epoch += 1
            sampler = self._dataloader.batch_sampler.sampler
            if hasattr(sampler, 'set_epoch'):
                sampler.set_epoch(self._epoch)
            if self._dataloader.num_workers > 0:
                time.sleep(WORKER_RESTART_PAUSE_S)
            self._iterator = iter(self._dataloader)
            return next(self._iterator)


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(IterBasedTrainLoop):
    """``IterBasedTrainLoop`` with a resume that skips by index.

    ``ExtRunner`` builds it where a config asks for ``IterBasedTrainLoop``
    (``mmddp_ext_cfg.exact_resume``); it takes the same arguments.

    Differs from ``IterBasedTrainLoop`` in its batch iterator
    (:class:`EndlessBatches`: a resumed run skips the batches it trained
    by index, where MMEngine loads and augments each of them) and in
    ``run_iter``, which seeds the global generators from ``(seed,
    iteration, rank)`` before the iteration's hooks run.
    """

    def __init__(self, *args, **kwargs) -> None:
        # IterBasedTrainLoop.__init__ builds its iterator through the name
        # _InfiniteDataloaderIterator of MMEngine's loops module, which
        # would create the dataloader's iterator at once: with workers it
        # starts loading, and an InfiniteSampler's one shared index
        # generator is closed when that first iterator is dropped (every
        # later pass then ends at once). EndlessBatches is built instead.
        built = loops_module._InfiniteDataloaderIterator
        loops_module._InfiniteDataloaderIterator = EndlessBatches
        try:
            super().__init__(*args, **kwargs)
        finally:
            loops_module._InfiniteDataloaderIterator = built

    def resume_at(self, batches: int) -> None:
        """Continue after the first ``batches`` batches of the run."""
        print_log(
            f'ResumableIterBasedTrainLoop: skipping the {batches} batches '
            'trained before the resume by index (nothing is loaded for '
            'them).',
            logger='current',
            level=logging.INFO)
        self.dataloader_iterator.fast_forward(batches, self._iter)

    def batches_in_epoch(self, epoch: int, iteration: int) -> int:
        """Batches a checkpoint that continues at ``iteration`` has trained
        (the whole run is one pass for this loop)."""
        return iteration

    def run_iter(self, data_batch) -> None:
        reseed_step(self.runner, 'iter', self._iter)
        super().run_iter(data_batch)
