"""``mmddp_ext_cfg`` is checked when ``ExtRunner`` is built."""
import pytest

from mmddp_ext.runner.ext_cfg import EXT_CFG_DEFAULTS
from mmddp_ext.runner.ext_runner import ExtRunner
from ..helpers import ToyModel


def _runner(tmp_path, ext_cfg):
    return ExtRunner(
        model=ToyModel(),
        work_dir=str(tmp_path),
        cfg=dict(mmddp_ext_cfg=ext_cfg))


def test_unknown_key_is_refused_naming_the_accepted_keys(tmp_path):
    with pytest.raises(ValueError) as info:
        _runner(tmp_path, dict(auto_dpp=True, empty_gt_stats=True))
    message = str(info.value)
    assert "mmddp_ext_cfg has unknown key(s) ['auto_dpp']" in message
    assert f'accepted keys are {sorted(EXT_CFG_DEFAULTS)}' in message


def test_not_a_dict_is_refused(tmp_path):
    with pytest.raises(TypeError, match='mmddp_ext_cfg must be a dict, but '
                       'got list'):
        _runner(tmp_path, ['auto_ddp'])


def test_known_keys_switch_their_hooks_on(tmp_path):
    """The control: the same runner with the keys spelled right."""
    runner = _runner(
        tmp_path,
        dict(auto_ddp=True, empty_gt_stats=True, rank_consistency=dict()))
    hooks = {type(h).__name__ for h in runner.hooks}
    assert {'EmptyGTStatsHook', 'RankConsistencyHook', 'SafeCheckpointHook',
            'RankStatusHook'} <= hooks
    assert 'CheckpointConflictHook' not in hooks  # its key is unset
