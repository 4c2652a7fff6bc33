"""A hook for the training tests: records what the model received.

Imported through ``custom_imports`` by the configs the tests write, so it
registers only in those training processes.
"""
import json
import os.path as osp

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class GuardBatchRecorder(Hook):
    """Write each training batch's GT counts, size and guard action to
    ``work_dir/batches_rank{r}.json`` when training ends."""
    priority = 'VERY_LOW'

    def __init__(self):
        self.batches = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        samples = data_batch['data_samples']
        marks = [s.metainfo.get('empty_gt_guard') for s in samples]
        action = next((name for mark in marks if mark
                       for name in ('swapped', 'fallback') if mark[name]),
                      None)
        self.batches.append(
            dict(
                gt=[len(s.gt_instances) for s in samples],
                images=len(data_batch['inputs']),
                action=action))

    def after_train(self, runner):
        path = osp.join(runner.work_dir, f'batches_rank{get_rank()}.json')
        with open(path, 'w') as f:
            json.dump(self.batches, f)
