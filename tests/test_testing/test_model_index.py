"""``model_index_read_once``: configs parse the same, mmdet's model index is
read once, and MMEngine's own reader is back after the block."""
import os.path as osp

from mmengine.config import Config
from mmengine.config import utils as config_utils
from mmengine.fileio import load
from mmengine.utils import get_installed_path

from mmddp_ext.testing import model_index_read_once


def test_configs_parse_the_same_with_the_index_read_once(tmp_path):
    config = tmp_path / 'runtime.py'
    config.write_text("_base_ = ['mmdet::_base_/default_runtime.py']\n"
                      'train_cfg = dict(max_epochs=3)\n')
    index = osp.join(get_installed_path('mmdet'), '.mim', 'model-index.yml')
    # control: MMEngine's reader loads the index again on every call
    assert config_utils.load(index) is not config_utils.load(index)
    read_each_time = Config.fromfile(str(config))
    with model_index_read_once():
        assert config_utils.load(index) is config_utils.load(index)
        first = Config.fromfile(str(config))
        second = Config.fromfile(str(config))
    assert config_utils.load is load
    assert first.to_dict() == second.to_dict() == read_each_time.to_dict()
    assert first.train_cfg.max_epochs == 3 and 'default_hooks' in first
