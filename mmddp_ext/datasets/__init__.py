from .empty_gt_guard_collate import (AllEmptyGTBatchError,
                                     empty_gt_guard_collate, num_gt_instances,
                                     reset_empty_gt_guard)
from .resumable_batch_sampler import ResumableBatchSampler, SampleKey
from .seeded_samples import SeededCollate, SeededFetch

__all__ = [
    'AllEmptyGTBatchError', 'empty_gt_guard_collate', 'num_gt_instances',
    'reset_empty_gt_guard', 'ResumableBatchSampler', 'SampleKey',
    'SeededCollate', 'SeededFetch'
]
