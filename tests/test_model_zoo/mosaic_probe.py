"""Observers for test_zoo_mosaic.py's training processes.

Imported through ``custom_imports`` by the config the test writes, so it
changes only those processes. It wraps some of MMDetection's
methods without changing what they do, and logs what they saw to each
rank's own MMEngine log:

- ``Mosaic.transform``: the GT box count of each of its four tiles (the
  sampled image first, then the three that ``MultiImageMixDataset`` drew
  for it), and the box count and size of the mosaic it made, as
  ``MosaicProbe: [0, 2, 1, 0] -> 3 boxes 128x128``.
- ``RandomAffine.transform``: the same for its one input, as
  ``RandomAffineProbe: [3] -> 2 boxes 64x64``.
- ``MixUp.transform``: the same for the mosaic it receives and the image
  ``MultiImageMixDataset`` drew for it, as
  ``MixUpProbe: [0, 3] -> 3 boxes 64x64``.
- ``BatchSyncRandomResize._get_random_size``: the size this rank got from
  rank 0's broadcast, as ``BatchSyncRandomResize: input size (96, 96)``.
"""
import functools

from mmdet.datasets.transforms import MixUp, Mosaic, RandomAffine
from mmdet.models.data_preprocessors import BatchSyncRandomResize
from mmengine.logging import print_log


def _num_boxes(results: dict) -> int:
    return len(results['gt_bboxes'])


def _observe_mixing(name: str, transform):
    """``transform`` that logs the box counts of the image it transforms
    and of the images mixed into it, then of its output and its size."""

    @functools.wraps(transform)
    def wrapper(self, results: dict) -> dict:
        images = [results] + list(results.get('mix_results', []))
        counts = [_num_boxes(image) for image in images]
        out = transform(self, results)
        height, width = out['img'].shape[:2]
        print_log(
            f'{name}: {counts} -> {_num_boxes(out)} boxes {height}x{width}',
            logger='current')
        return out

    return wrapper


def _observe_random_size(get_random_size):

    @functools.wraps(get_random_size)
    def wrapper(self, *args, **kwargs):
        size = get_random_size(self, *args, **kwargs)
        print_log(
            f'BatchSyncRandomResize: input size {tuple(size)}',
            logger='current')
        return size

    return wrapper


Mosaic.transform = _observe_mixing('MosaicProbe', Mosaic.transform)
RandomAffine.transform = _observe_mixing('RandomAffineProbe',
                                         RandomAffine.transform)
MixUp.transform = _observe_mixing('MixUpProbe', MixUp.transform)
BatchSyncRandomResize._get_random_size = _observe_random_size(
    BatchSyncRandomResize._get_random_size)
