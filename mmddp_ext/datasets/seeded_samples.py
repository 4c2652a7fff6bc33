"""Augmentation randomness drawn from the run's seed, the training batch
and the sample index, not from the process that happens to load it.

MMEngine seeds each DataLoader worker once, when it starts, with
``num_workers * rank + worker_id + seed``: the random numbers a sample's
transforms draw then depend on which worker loads it and on what that
worker loaded before. With ``persistent_workers=False`` every epoch
replays the same streams, and a resumed run, whose first batch goes to
worker 0 whatever its position, draws other numbers than the
uninterrupted run did.

:class:`SeededFetch` is the dataset's ``__getitems__`` (which torch's
DataLoader calls with a whole batch of indices, in the worker or in the
main process): it loads each sample with Python's, numpy's and torch's
global generators seeded from ``(seed, batch, index)``
(:class:`~mmddp_ext.datasets.resumable_batch_sampler.SampleKey` carries the
batch), and :class:`SeededCollate` collates the batch with them seeded
from ``(seed, batch)``; both put the generators back afterwards, so the
main process's own stream (denoising noise, dropout) is the same with 0
or N workers. ``ExtRunner`` installs both on the training dataloader
(``mmddp_ext_cfg.exact_resume``).
"""
import contextlib
import random
from typing import Any, Callable, Iterator, List, Sequence

import numpy as np
import torch

_SAMPLE, _COLLATE, _STEP = 0, 1, 2


def derive_seed(*entropy: int) -> int:
    """A 63-bit seed mixed from non-negative integers (numpy's
    ``SeedSequence``: nearby inputs give unrelated seeds)."""
    state = np.random.SeedSequence([int(e) for e in entropy])
    high, low = state.generate_state(2)
    return ((int(high) << 32) | int(low)) >> 1


def seed_global_generators(seed: int) -> None:
    """Seed Python's, numpy's and torch's (CPU and every CUDA device's)
    global generators from ``seed``."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def step_seed(seed: int, *position: int) -> int:
    """The seed of a training step (or epoch) at ``position`` (for example
    ``(iteration, rank)``) of a run seeded with ``seed``."""
    return derive_seed(seed % 2**63, _STEP, *position)


@contextlib.contextmanager
def seeded_generators(seed: int) -> Iterator[None]:
    """Run the body with the global generators seeded from ``seed``, then
    restore them as they were (CUDA's are not touched: data loading runs
    on the CPU)."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.random.default_generator.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


class SeededBatch(list):
    """The samples of one batch, with the seed their collation uses."""
    collate_seed: int


class SeededFetch:
    """``dataset.__getitems__``: load a batch of
    :class:`~mmddp_ext.datasets.resumable_batch_sampler.SampleKey` indices,
    each sample under its own seed. Plain ``int`` indices (a dataloader
    without ``ResumableBatchSampler``) load as the dataset loads them.

    Args:
        dataset: The dataset; ``dataset[index]`` loads one sample.
        seed (int): The run's seed.
    """

    def __init__(self, dataset: Any, seed: int) -> None:
        self.dataset = dataset
        self.seed = seed % 2**63

    def __call__(self, keys: Sequence[int]) -> List[Any]:
        if not keys or not hasattr(keys[0], 'batch'):
            return [self.dataset[key] for key in keys]
        batch = keys[0].batch
        samples = SeededBatch()
        for key in keys:
            with seeded_generators(
                    derive_seed(self.seed, _SAMPLE, key.batch, int(key))):
                samples.append(self.dataset[int(key)])
        samples.collate_seed = derive_seed(self.seed, _COLLATE, batch)
        return samples


class SeededCollate:
    """A collate function run under the seed of its batch
    (:class:`SeededBatch`); any other list collates as ``collate_fn``
    does.

    Args:
        collate_fn (callable): The dataloader's collate function.
    """

    def __init__(self, collate_fn: Callable) -> None:
        self.collate_fn = collate_fn

    def __call__(self, samples: List[Any]) -> Any:
        seed = getattr(samples, 'collate_seed', None)
        if seed is None:
            return self.collate_fn(samples)
        with seeded_generators(seed):
            return self.collate_fn(list(samples))


def install_seeded_samples(dataloader: Any, seed: int) -> None:
    """Seed each sample and batch of ``dataloader`` by its key
    (:class:`SeededFetch`, :class:`SeededCollate`), and give it a
    generator of its own, so that creating its iterator (which draws a
    base seed for its workers) leaves the global torch generator as it
    was. Call it before the dataloader's first iterator."""
    dataloader.dataset.__getitems__ = SeededFetch(dataloader.dataset, seed)
    if not isinstance(dataloader.collate_fn, SeededCollate):
        dataloader.collate_fn = SeededCollate(dataloader.collate_fn)
    if dataloader.generator is None:
        generator = torch.Generator()
        generator.manual_seed(derive_seed(seed % 2**63, _COLLATE))
        dataloader.generator = generator
