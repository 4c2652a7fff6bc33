"""The one resolver of a config's DDP set-up (ExtRunner, the DDP doctor
and tools/train.py read it): which setting wins, which hooks ExtRunner
adds, the device_ids, whether a config is an ExtRunner one."""
import pytest
import torch
from mmengine.config import Config
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

import mmddp_ext  # noqa: F401  (registers the wrappers and hooks)
from mmddp_ext.runner import ExtRunner
from mmddp_ext.runner.ddp_setup import (ddp_device_ids, resolve_ddp_setup,
                                        wrapper_cfg)
from mmddp_ext.runner.ext_cfg import (EXT_CFG_DEFAULTS, checked_ext_cfg,
                                      ext_cfg_of, ext_hooks, opted_in)
from ..helpers import ToyModel

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
    assert checked_ext_cfg(None) == EXT_CFG_DEFAULTS
    assert checked_ext_cfg(None, EXT_CFG_DEFAULTS) == EXT_CFG_DEFAULTS
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['auto_dpp'\]"):
        checked_ext_cfg(dict(auto_dpp=True), EXT_CFG_DEFAULTS)
    with pytest.raises(TypeError, match='must be a dict'):
        checked_ext_cfg(['auto_ddp'], EXT_CFG_DEFAULTS)


@RUNNERS.register_module(name='DerivedExtRunnerForDDPSetup', force=True)
class _DerivedExtRunner(ExtRunner):
    pass


@pytest.mark.parametrize('runner_type, expected', [
    (None, False),
    ('Runner', False),
    ('ExtRunner', True),
    ('DerivedExtRunnerForDDPSetup', True),
    (ExtRunner, True),
    ('NoSuchRunner', False),
])
def test_opted_in(runner_type, expected):
    cfg = Config(dict(default_scope='mmdet', mmddp_ext_cfg=dict(
        auto_ddp=True)) if runner_type is None else dict(
            default_scope='mmdet', runner_type=runner_type,
            mmddp_ext_cfg=dict(auto_ddp=True)))
    assert opted_in(cfg) is expected
    ext = ext_cfg_of(cfg)
    assert ext == (dict(EXT_CFG_DEFAULTS, auto_ddp=True) if expected else
                   None)
    assert (resolve_ddp_setup(cfg).wrapper == 'AutoDDP') is expected


def test_invalid_ext_cfg_raises_for_the_runner_and_is_defaults_for_doctor():
    cfg = Config(dict(runner_type='ExtRunner',
                      mmddp_ext_cfg=dict(auto_dpp=True)))
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['auto_dpp'\]"):
        ext_cfg_of(cfg)
    assert ext_cfg_of(cfg, strict=False) == EXT_CFG_DEFAULTS
    assert resolve_ddp_setup(cfg).ext_cfg == EXT_CFG_DEFAULTS


def test_hooks_of_ext_cfg_are_what_the_runner_registers(tmp_path):
    """ext_hooks is the one list: ExtRunner registers exactly it (but for
    a type the config lists), and the resolver reports it."""
    ext = dict(ON, empty_gt_stats=True, rank_consistency=dict(check_every=7),
               nonfinite_skip=dict(max_consecutive_skips=2))
    hooks = ext_hooks(checked_ext_cfg(ext))
    assert hooks == [
        ('SafeCheckpointHook', {}), ('RankStatusHook', {}),
        ('CheckpointConflictHook', dict(policy='disable')),
        ('EmptyGTStatsHook', {}), ('FinitePredictionsHook', {}),
        ('RankConsistencyHook', dict(check_every=7)),
        ('NonFiniteSkipHook', dict(max_consecutive_skips=2)),
        ('PreemptionHook', {})  # on unless preemption=None
    ]
    assert ext_hooks(None) == []
    listed = [dict(type='CheckpointConflictHook', policy='error')]
    runner = ExtRunner(
        model=ToyModel(),
        work_dir=str(tmp_path),
        custom_hooks=listed,
        cfg=dict(mmddp_ext_cfg=ext, custom_hooks=listed))
    stock = {type(h).__name__ for h in Runner(
        model=ToyModel(), work_dir=str(tmp_path / 'stock')).hooks}
    added = [type(h).__name__ for h in runner.hooks
             if type(h).__name__ not in stock]
    assert sorted(added) == sorted(name for name, _ in hooks)
    policies = [h.policy for h in runner.hooks
                if type(h).__name__ == 'CheckpointConflictHook']
    assert policies == ['error']  # the config's, not the added one
    setup = resolve_ddp_setup(runner.cfg, runner.ext_cfg)
    assert setup.hooks == [h for h in hooks
                           if h[0] != 'CheckpointConflictHook']
    assert setup.checkpoint_policy == 'error' and setup.rank_consistency


def test_device_ids_follow_the_rank_device():
    """device_ids: the rank's CUDA device, None on CPU ranks (stock Runner
    passes [LOCAL_RANK], which DDP refuses for a CPU model: the control in
    test_sync_bn_on_cpu.py)."""
    assert ddp_device_ids('cpu') is None
    assert ddp_device_ids(torch.device('cuda', 1)) == [1]
    with pytest.raises(ValueError, match="needs the rank's own device"):
        ddp_device_ids('cuda')
    cfg = Config(dict())
    for ext in (dict(ON), None):  # AutoDDP, MMDistributedDataParallel
        cpu = resolve_ddp_setup(cfg, ext, device='cpu')
        assert cpu.wrapper_cfg['device_ids'] is None
        gpu1 = resolve_ddp_setup(cfg, ext, device=torch.device('cuda', 1))
        assert gpu1.wrapper_cfg['device_ids'] == [1]
        # A launch on GPUs in general (the doctor's question): per rank.
        assert 'device_ids' not in resolve_ddp_setup(cfg, ext).wrapper_cfg
    own = Config(dict(model_wrapper_cfg=dict(
        type='MMDistributedDataParallel', device_ids=[3])))
    assert resolve_ddp_setup(own, None, device=torch.device(
        'cuda', 1)).wrapper_cfg['device_ids'] == [3]
