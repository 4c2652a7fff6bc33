"""``ResumableBatchSampler``: a training batch sampler that a resumed run
can start in the middle of a pass, skipping by index, and whose batches
say which training batch they are.

MMEngine resumes a run at the iteration its checkpoint names but iterates
the data loader from the start of the epoch again, so the first part of
the epoch is trained twice (``EpochBasedTrainLoop``), or skips by loading
and augmenting every batch already trained (``IterBasedTrainLoop``). This
wrapper skips inside the batch sampler, where a batch is a list of
indices: nothing is loaded for the batches skipped, and whatever groups
indices into batches (``AspectRatioBatchSampler``, a custom one) groups
them exactly as the uninterrupted run did.

Each index it yields is a :class:`SampleKey`: the dataset index that
also carries the number of the training batch it belongs to (0 for the
first batch of the run, counted across epochs). The dataset fetch of
:mod:`mmddp_ext.datasets.seeded_samples` seeds each sample's augmentation
from the run's seed, that number and the index, so a sample is augmented
the same way whichever worker process loads it, before or after a resume.
"""
import itertools
from typing import Iterator, List, Optional, Union

from mmengine.registry import DATA_SAMPLERS
from torch.utils.data import BatchSampler, Sampler


class SampleKey(int):
    """A dataset index that knows its training batch.

    Behaves as the ``int`` index everywhere (``dataset[key]``, arithmetic,
    comparisons); ``batch`` is the number of the training batch.
    """
    batch: int

    def __new__(cls, index: int, batch: int) -> 'SampleKey':
        key = super().__new__(cls, index)
        key.batch = batch
        return key

    def __reduce__(self):
        # DataLoader workers receive batches of indices through a queue.
        return SampleKey, (int(self), self.batch)

    def __repr__(self) -> str:
        return f'SampleKey({int(self)}, batch={self.batch})'


@DATA_SAMPLERS.register_module()
class ResumableBatchSampler(BatchSampler):
    """Batch sampler that numbers its batches and can resume mid-pass.

    ``ExtRunner`` puts it around the training dataloader's batch sampler
    (``mmddp_ext_cfg.exact_resume``); the epoch still reaches the sampler
    through ``.sampler.set_epoch`` as MMEngine's hooks call it.

    Args:
        sampler (Sampler): The index sampler (``DefaultSampler``,
            ``InfiniteSampler``...), as MMEngine builds it.
        batch_size (int): Images per batch on this rank.
        batch_sampler (BatchSampler | dict, optional): The batch sampler
            to wrap, or its config (built with ``sampler`` and
            ``batch_size``). None groups consecutive indices, as the
            ``DataLoader`` does without a batch sampler. Defaults to None.
        drop_last (bool): Without ``batch_sampler``: drop the last
            incomplete batch of a pass. Defaults to False.
    """

    def __init__(self,
                 sampler: Sampler,
                 batch_size: int,
                 batch_sampler: Optional[Union[BatchSampler, dict]] = None,
                 drop_last: bool = False) -> None:
        if isinstance(batch_sampler, dict):
            batch_sampler = DATA_SAMPLERS.build(
                batch_sampler,
                default_args=dict(sampler=sampler, batch_size=batch_size))
        elif batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        # Not BatchSampler.__init__: every attribute it sets is the inner
        # batch sampler's, read through the properties below.
        self.inner = batch_sampler
        self.next_batch = 0
        self._skip = 0
        self._pending: Optional[Iterator[List[int]]] = None

    @property
    def sampler(self) -> Sampler:
        """The index sampler; MMEngine sets its epoch through this."""
        return self.inner.sampler

    @property
    def batch_size(self) -> int:
        return self.inner.batch_size

    @property
    def drop_last(self) -> bool:
        return getattr(self.inner, 'drop_last', False)

    def __len__(self) -> int:
        return len(self.inner)

    def skip_in_next_pass(self, batches: int) -> None:
        """Start the next pass (``iter``) after its first ``batches``
        batches, skipped by index."""
        if batches < 0:
            raise ValueError(f'cannot skip {batches} batches')
        self._skip = batches

    def fast_forward(self, batches: int, start_epoch: int = 0) -> int:
        """Advance by ``batches`` batches from the start of training, by
        index, across passes as an endless iterator over the dataloader
        does (the sampler's epoch goes up by one at the end of each
        pass), and continue from there at the next ``iter``.

        Args:
            batches (int): Batches already trained.
            start_epoch (int): The sampler's epoch of the first pass.
                Defaults to 0.

        Returns:
            int: The sampler's epoch of the pass training continues in.
        """
        epoch, left = start_epoch, batches
        while True:
            _set_epoch(self.sampler, epoch)
            batches_of_pass = iter(self.inner)
            taken = sum(1 for _ in itertools.islice(batches_of_pass, left))
            left -= taken
            if left == 0:
                self._pending = batches_of_pass
                return epoch
            if taken == 0:
                raise ValueError('the batch sampler yields no batch; the '
                                 'training dataset is empty')
            epoch += 1

    def __iter__(self) -> Iterator[List[SampleKey]]:
        batches = self._pending or iter(self.inner)
        self._pending = None
        skip, self._skip = self._skip, 0
        for _ in itertools.islice(batches, skip):
            pass
        for indices in batches:
            number = self.next_batch
            self.next_batch += 1
            yield [SampleKey(index, number) for index in indices]


def _set_epoch(sampler: Sampler, epoch: int) -> None:
    if hasattr(sampler, 'set_epoch'):
        sampler.set_epoch(epoch)
