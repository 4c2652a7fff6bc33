"""The one resolver of a config's DDP set-up (ExtRunner.wrap_model and the
DDP doctor read it): which setting wins."""
import pytest
from mmengine.config import Config

import mmddp_ext  # noqa: F401  (registers the wrappers and hooks)
from mmddp_ext.runner.ddp_setup import (EXT_CFG_DEFAULTS, checked_ext_cfg,
                                        resolve_ddp_setup, wrapper_cfg)

ON = dict(EXT_CFG_DEFAULTS, auto_ddp=True, checkpoint_conflict='disable',
          empty_gt_guard=dict(policy='keep'))


def test_wrapper_precedence():
    given = dict(type='MMDistributedDataParallel', find_unused_parameters=True)
    # model_wrapper_cfg wins over auto_ddp and a top-level flag.
    assert wrapper_cfg(given, True, False) == given
    assert wrapper_cfg(given, True, False) is not given  # a copy
    # auto_ddp: AutoDDP, the top-level flag passed on as given (None: decide).
    assert wrapper_cfg(None, True, None) == dict(
        type='AutoDDP', broadcast_buffers=False, find_unused_parameters=None)
    assert wrapper_cfg(None, True, True)['find_unused_parameters'] is True
    # Neither: stock MMEngine's arguments.
    assert wrapper_cfg(None, False, None) == dict(
        type='MMDistributedDataParallel', broadcast_buffers=False,
        find_unused_parameters=False)
    assert wrapper_cfg(dict(find_unused_parameters=True), False, None)[
        'type'] == 'MMDistributedDataParallel'


def test_resolved_setup_for_gpus_and_for_cpu_ranks():
    cfg = Config(dict(
        sync_bn='torch',
        find_unused_parameters=True,
        custom_hooks=[dict(type='CheckpointConflictHook', policy='error')],
        train_dataloader=dict(batch_size=2)))
    gpus = resolve_ddp_setup(cfg, dict(ON))
    assert (gpus.wrapper, gpus.auto_ddp, gpus.find_unused) == ('AutoDDP',
                                                               True, True)
    assert (gpus.sync_bn, gpus.sync_bn_skipped) == ('torch', False)
    assert gpus.checkpoint_policy == 'error'  # the listed hook wins
    assert gpus.collate == dict(type='empty_gt_guard_collate', policy='keep')
    cpu = resolve_ddp_setup(cfg, dict(ON), device='cpu')
    assert (cpu.sync_bn, cpu.sync_bn_skipped) == (None, True)

    stock = resolve_ddp_setup(cfg, None)  # not an ExtRunner: all off
    assert (stock.wrapper, stock.find_unused, stock.opted_in) == (
        'MMDistributedDataParallel', True, False)
    assert stock.collate == dict(type='pseudo_collate')
    assert stock.checkpoint_policy == 'error'  # the hook is still listed
    own = Config(dict(train_dataloader=dict(collate_fn=dict(type='mine'))))
    assert resolve_ddp_setup(own, dict(ON)).collate == dict(type='mine')


def test_ext_cfg_is_checked_once_for_runner_and_doctor():
    assert checked_ext_cfg(None, EXT_CFG_DEFAULTS) == EXT_CFG_DEFAULTS
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['auto_dpp'\]"):
        checked_ext_cfg(dict(auto_dpp=True), EXT_CFG_DEFAULTS)
    with pytest.raises(TypeError, match='must be a dict'):
        checked_ext_cfg(['auto_ddp'], EXT_CFG_DEFAULTS)
