"""The adversarial batch schedule of the dynamic probe.

Iteration ``k`` is of kind ``k % 3``:

0. every rank's batch has GT (the images as annotated);
1. the last rank's batch has no GT at all (boxes removed from its samples);
2. every rank's batch holds a single box (the first image keeps one box,
   the others none).

Samples are real dataset samples run through the config's pipeline, each
under a seed of its own, so every process loads the same augmented sample
for an index (the single-process reference of the gradient comparison
rebuilds the other ranks' batches from the indices).

The gradient comparison has batches of its own
(:meth:`AdversarialSchedule.equivalence_batches`): two images per rank,
the first with the most boxes any annotated image has (at most
``MAX_EQUIVALENCE_BOXES``), the second cut to fewer boxes on each later
rank (none on the last). The ranks' box counts differ, so a loss that a
rank normalises by its own count gives another gradient than one process
over all the images; the largest box count per image is the same in every
batch, so heads that size their denoising groups by it build the same
groups on every rank and in the whole batch.
"""
import contextlib
import random
from typing import Any, Iterator, List

import numpy as np
import torch

KINDS = ('every rank has GT', 'last rank has no GT', 'a single box per rank')
SAMPLE_SEED = 1234
MAX_EQUIVALENCE_BOXES = 8
# Annotated images loaded to find ones of the same padded size.
EQUIVALENCE_CANDIDATES = 16


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Seed Python, NumPy and torch inside the block; restore after."""
    py_state, np_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def num_boxes(data_sample: Any) -> int:
    """GT boxes of a data sample (0 without ``gt_instances``)."""
    gt = getattr(data_sample, 'gt_instances', None)
    return 0 if gt is None else len(gt)


def keep_boxes(sample: dict, count: int) -> dict:
    """The sample with only its first ``count`` GT boxes."""
    data_sample = sample['data_samples'].clone()
    data_sample.gt_instances = data_sample.gt_instances[:count]
    return dict(sample, data_samples=data_sample)


def annotated_indices(dataset) -> List[int]:
    """Indices of the images that have at least one usable box."""
    found = []
    for index in range(len(dataset)):
        instances = dataset.get_data_info(index).get('instances', [])
        if any(not inst.get('ignore_flag', 0) for inst in instances):
            found.append(index)
    return found


class AdversarialSchedule:
    """Which samples each rank trains on in each probe iteration.

    Args:
        dataset: The train dataset, built from the config.
        world_size (int): Number of ranks.
        batch_size (int): Samples per rank and iteration.
    """

    def __init__(self, dataset, world_size: int, batch_size: int) -> None:
        self.dataset = dataset
        self.world_size = world_size
        self.batch_size = batch_size
        self.indices = annotated_indices(dataset)
        if not self.indices:
            raise ValueError(
                'the train dataset has no image with a box; the dynamic '
                'checks need at least one annotated image '
                '(train_dataloader.dataset).')

    @staticmethod
    def kind(iteration: int) -> str:
        return KINDS[iteration % len(KINDS)]

    def load(self, index: int) -> dict:
        prepare = getattr(self.dataset, 'prepare_data',
                          self.dataset.__getitem__)
        with _seeded(SAMPLE_SEED + index):
            sample = prepare(index)
        if sample is None:
            raise ValueError(
                f'the train pipeline returned None for image {index} '
                '(a pipeline step filtered it); the probe needs images the '
                'pipeline keeps.')
        return sample

    def slot_indices(self, rank: int, iteration: int) -> List[int]:
        start = (iteration * self.world_size + rank) * self.batch_size
        return [
            self.indices[(start + j) % len(self.indices)]
            for j in range(self.batch_size)
        ]

    def batch(self, rank: int, iteration: int) -> List[dict]:
        """Rank ``rank``'s samples in iteration ``iteration``."""
        samples = [self.load(i) for i in self.slot_indices(rank, iteration)]
        kind = iteration % len(KINDS)
        if kind == 1 and rank == self.world_size - 1:
            return [keep_boxes(s, 0) for s in samples]
        if kind == 2:
            return [keep_boxes(s, 1 if j == 0 else 0)
                    for j, s in enumerate(samples)]
        return samples

    def equivalence_batches(self) -> List[List[dict]]:
        """Every rank's batch for the gradient comparison (see the module
        docstring)."""
        candidates = [(i, self.load(i))
                      for i in self.indices[:EQUIVALENCE_CANDIDATES]]
        shapes: dict = {}
        for index, sample in candidates:
            shapes.setdefault(tuple(sample['inputs'].shape), []).append(
                (index, sample))
        # The images of the most common size: padding then adds nothing.
        same = max(shapes.values(), key=len)
        same.sort(key=lambda pair: -num_boxes(pair[1]['data_samples']))
        richest = same[0][1]
        most = min(num_boxes(richest['data_samples']), MAX_EQUIVALENCE_BOXES)
        others = [s for _, s in same[1:]] or [richest]
        last = max(1, self.world_size - 1)
        batches = []
        for rank in range(self.world_size):
            wanted = most * (self.world_size - 1 - rank) // last
            second = others[rank % len(others)]
            batches.append([
                keep_boxes(richest, most),
                keep_boxes(second,
                           min(wanted, num_boxes(second['data_samples'])))
            ])
        return batches

    @staticmethod
    def box_counts(batches: List[List[dict]]) -> List[List[int]]:
        return [[num_boxes(s['data_samples']) for s in b] for b in batches]
