"""RTDETRAugmentStopHook: v2's stop epoch for transforms and multi-scale."""
from unittest.mock import MagicMock

from mmengine.registry import DefaultScope
from torch import nn

from .rtdetr_utils import import_project


def test_stops_pipeline_and_batch_augments_at_switch_epoch():
    # A runner sets the default scope before any hook runs; the switch
    # pipeline's ``PackDetInputs`` is found through it. Set it here rather
    # than depend on an earlier test of the same process having set it.
    with DefaultScope.overwrite_default_scope('mmdet'):
        _stops_pipeline_and_batch_augments_at_switch_epoch()


def _stops_pipeline_and_batch_augments_at_switch_epoch():
    hook_cls = import_project().RTDETRAugmentStopHook
    hook = hook_cls(
        switch_epoch=2, switch_pipeline=[dict(type='PackDetInputs')])
    runner = MagicMock()
    runner.model = nn.Module()
    runner.model.data_preprocessor = nn.Module()
    runner.model.data_preprocessor.batch_augments = nn.ModuleList(
        [nn.Identity()])
    runner.train_dataloader.persistent_workers = False
    pipeline = runner.train_dataloader.dataset.pipeline
    for epoch in (0, 1):
        runner.epoch = epoch
        hook.before_train_epoch(runner)
        assert runner.train_dataloader.dataset.pipeline is pipeline
        assert runner.model.data_preprocessor.batch_augments is not None
    runner.epoch = 2
    hook.before_train_epoch(runner)
    assert runner.train_dataloader.dataset.pipeline is not pipeline
    assert runner.model.data_preprocessor.batch_augments is None
