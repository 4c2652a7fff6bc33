"""Shared helpers for the benchmark scripts (run from the repo root)."""
import os.path as osp
import statistics
import sys
import tempfile
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


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

    A step's time depends mostly on its batch (an all-empty batch of a
    DETR is far cheaper than one with boxes), so the median over a mix of
    batches jumps between the cheap and the dear ones with small changes
    of the mix and is no basis for a ratio. Here each batch index (the
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
