from .empty_gt_guard_collate import (AllEmptyGTBatchError,
                                     empty_gt_guard_collate, num_gt_instances,
                                     reset_empty_gt_guard)

__all__ = [
    'AllEmptyGTBatchError', 'empty_gt_guard_collate', 'num_gt_instances',
    'reset_empty_gt_guard'
]
