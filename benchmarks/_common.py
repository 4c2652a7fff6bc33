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
    """Hook-like object recording the wall time of each train iteration."""
    priority = 'VERY_LOW'

    def __init__(self):
        self.times = []
        self._start = None

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self._start = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None,
                         outputs=None):
        self.times.append(time.perf_counter() - self._start)


def median(values):
    return statistics.median(values) if values else float('nan')
