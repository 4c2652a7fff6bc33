"""Shared helpers for the benchmark scripts (run from the repo root)."""
import math
import os.path as osp
import random
import statistics
import sys
import tempfile
import time
from typing import Dict, Hashable, List, Sequence, Tuple

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


# Overrides for timed runs: no log line and no checkpoint inside a timed
# step. StepTimer's after_train_iter runs after CheckpointHook's, so the
# last step would otherwise include the final checkpoint save, several
# times a step's time, and bias whichever mode that step had.
TIMED_RUN_OVERRIDES = {
    'default_hooks.logger.interval': 1000,
    'default_hooks.checkpoint': None,
}


def make_dataset(num_images=32, empty=0.5):
    from mmddp_ext.testing import make_synthetic_coco
    root = tempfile.mkdtemp(prefix='mmddp_bench_')
    make_synthetic_coco(osp.join(root, 'train'), num_images=num_images,
                        empty=empty)
    make_synthetic_coco(osp.join(root, 'val'), num_images=4, seed=1)
    return root


class StepTimer:
    """Hook-like object recording the wall time of each train iteration
    and which batch of the epoch it trained on (``batches``: its index in
    the epoch, the same images in every epoch when the sampler does not
    shuffle)."""
    priority = 'VERY_LOW'

    def __init__(self):
        self.times = []
        self.batches = []
        self._start = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        # Iteration-based loops pass the global iteration as batch_idx;
        # with an unshuffled sampler, the batch repeats every epoch.
        self.batches.append(batch_idx % len(runner.train_dataloader))
        self._start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.times.append(time.perf_counter() - self._start)


def median(values):
    return statistics.median(values) if values else float('nan')


def paired_ratio(times_a, batches_a, times_b, batches_b):
    """Step-time ratio a / b, paired by batch.

    A DETR step's time depends on its batch (its boxes set the number of
    denoising queries and the matching work), so a ratio of medians over
    a mix of batches moves with the mix. Here each batch index (the
    same images when the sampler does not shuffle) gets the ratio of its
    median times, and the result is the geometric mean over the batches
    that both sides trained on.
    """
    by_batch = ({}, {})
    for side, times, batches in ((0, times_a, batches_a),
                                 (1, times_b, batches_b)):
        for step, batch in zip(times, batches):
            by_batch[side].setdefault(batch, []).append(step)
    common = sorted(set(by_batch[0]) & set(by_batch[1]))
    if not common:
        return float('nan')
    return statistics.geometric_mean(
        median(by_batch[0][b]) / median(by_batch[1][b]) for b in common)


# ---------------------------------------------------------------------------
# Same-batch interleaving: each batch is trained on ``2 x len(modes)`` times
# in a row, every mode twice in a mirrored order (A B B A, B A A B; A B C C B
# A, B C A A C B, ...), so that every comparison is between steps on the
# same images a few seconds apart. On a shared 2-core machine the load
# drifts within a minute, and a DETR step's time depends on its batch;
# pairing adjacent steps on the same batch cancels both, more closely than
# pairing steps of the same batch index one dataset cycle apart
# (``paired_ratio``).

SAME_BATCH_SAMPLER = 'BenchSameBatchSampler'
SAME_BATCH_SIZE = 2  # images per rank and step


def register_same_batch_sampler():
    """Register :data:`SAME_BATCH_SAMPLER` in MMEngine's sampler registry
    (call it in every rank's process, before the runner is built).

    The sampler takes this rank's share of the dataset in order (as an
    unshuffled ``DefaultSampler``) and yields every batch of ``batch_size``
    indices ``repeats`` times in a row.
    """
    from mmengine.dist import get_dist_info
    from mmengine.registry import DATA_SAMPLERS
    from torch.utils.data import Sampler

    class SameBatchSampler(Sampler):

        def __init__(self, dataset, batch_size: int, repeats: int,
                     seed=None):
            rank, world_size = get_dist_info()
            share = list(range(rank, len(dataset), world_size))
            if len(share) % batch_size:
                raise ValueError(
                    f'{SAME_BATCH_SAMPLER}: {len(share)} images per rank is '
                    f'not a multiple of batch_size={batch_size}; make the '
                    'benchmark dataset a multiple of world_size x '
                    'batch_size.')
            self.indices = []
            for start in range(0, len(share), batch_size):
                self.indices += share[start:start + batch_size] * repeats

        def __iter__(self):
            return iter(self.indices)

        def __len__(self):
            return len(self.indices)

        def set_epoch(self, epoch):
            pass

    DATA_SAMPLERS.register_module(
        name=SAME_BATCH_SAMPLER, module=SameBatchSampler, force=True)


def same_batch_overrides(modes: Sequence[str]) -> Dict:
    """Runner config overrides that feed every batch ``2 x len(modes)``
    times in a row (with :func:`register_same_batch_sampler`)."""
    return {
        'train_dataloader.sampler': dict(
            _delete_=True,
            type=SAME_BATCH_SAMPLER,
            batch_size=SAME_BATCH_SIZE,
            repeats=2 * len(modes)),
        'train_dataloader.batch_size': SAME_BATCH_SIZE,
    }


def same_batch_mode(iteration: int, modes: Sequence[str]) -> str:
    """The mode of ``iteration``: group ``g = iteration // (2 x len(modes))``
    trains on one batch, in the order of ``modes`` rotated by ``g`` and then
    mirrored, so that each mode runs twice per group, each mode is first as
    often as the others, and a mode's mean position in its group is the
    same for every mode."""
    size = len(modes)
    group, slot = divmod(iteration, 2 * size)
    order = list(modes[group % size:]) + list(modes[:group % size])
    return (order + order[::-1])[slot]


def mode_medians(records: List[Tuple[Hashable, str, float]],
                 modes: Sequence[str]) -> Dict[str, float]:
    """The median step time of each mode in ``(group, mode, seconds)``
    records."""
    return {
        name: median([seconds for _, mode, seconds in records
                      if mode == name])
        for name in modes
    }


def same_batch_ratios(records: List[Tuple[Hashable, str, float]], a: str,
                      b: str, resamples: int = 2000,
                      seed: int = 0) -> Tuple[float, float, float, int]:
    """Step-time ratio ``a / b`` from same-batch groups.

    Args:
        records: ``(group, mode, seconds)`` per measured step; ``group``
            is any key of the batch's steps (``(run, group)`` across runs).
        a, b: The modes compared.

    Returns:
        ``(ratio, low, high, groups)``: the median over the groups of each
        group's ``mean(a) / mean(b)``, the 5th and 95th percentiles of that
        median over bootstrap resamples of the groups (a 90 % interval)
        and the number of groups. The median, because a shared machine
        now and then stalls one step for a multiple of its time, and a mean
        follows such outliers.
    """
    by_group: Dict[Hashable, Dict[str, List[float]]] = {}
    for group, mode, seconds in records:
        by_group.setdefault(group, {}).setdefault(mode, []).append(seconds)
    logs = [
        math.log(statistics.fmean(g[a]) / statistics.fmean(g[b]))
        for g in by_group.values() if g.get(a) and g.get(b)
    ]
    if not logs:
        return float('nan'), float('nan'), float('nan'), 0
    rng = random.Random(seed)
    medians = sorted(
        statistics.median(rng.choices(logs, k=len(logs)))
        for _ in range(resamples))
    low = medians[int(0.05 * (resamples - 1))]
    high = medians[int(0.95 * (resamples - 1))]
    return (math.exp(statistics.median(logs)), math.exp(low),
            math.exp(high), len(logs))


def det_batch(num_images, height, width, num_boxes, num_classes, seed=0):
    """An mmdet batch (``inputs``, ``data_samples``, as the dataloader
    gives it: uint8 images on the CPU) of random images and boxes;
    ``num_boxes`` is a count for every image or a list, one per image."""
    import torch
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    generator = torch.Generator().manual_seed(seed)
    if isinstance(num_boxes, int):
        num_boxes = [num_boxes] * num_images
    inputs, samples = [], []
    for count in num_boxes:
        inputs.append(
            torch.randint(0, 256, (3, height, width), generator=generator,
                          dtype=torch.uint8))
        xy = torch.rand(count, 2, generator=generator) * torch.tensor(
            [width * 0.7, height * 0.7])
        wh = torch.rand(count, 2, generator=generator) * torch.tensor(
            [width * 0.3, height * 0.3]) + 8
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(height, width),
                ori_shape=(height, width),
                pad_shape=(height, width),
                scale_factor=(1.0, 1.0),
                batch_input_shape=(height, width)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([xy, xy + wh], dim=1),
            labels=torch.randint(
                0, num_classes, (count, ), generator=generator))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)
