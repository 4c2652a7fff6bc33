"""ExtRunner formats its config text with yapf once per content
(FormattedOnceConfig); stock MMEngine formats it on every log and dump."""
import copy
import os.path as osp
import pickle

import pytest
from mmengine.config import Config

from mmddp_ext.runner.ext_runner import ExtRunner
from mmddp_ext.runner.formatted_once_config import FormattedOnceConfig
from ..helpers import REPO_ROOT, ToyModel

CONFIG = osp.join(REPO_ROOT, 'configs', 'dino_tiny.py')


@pytest.fixture
def format_calls(monkeypatch):
    """The yapf calls ``Config.pretty_text`` makes, counted."""
    import mmengine.config.config as config_module
    calls = []
    real = config_module.FormatCode

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(config_module, 'FormatCode', counted)
    return calls


def _start_runner(work_dir: str, cfg: Config) -> ExtRunner:
    """An ExtRunner over the full config of a shipped detector (the model is
    a toy: the config is what the runner logs and dumps)."""
    return ExtRunner(
        model=ToyModel(),
        work_dir=work_dir,
        experiment_name='start',
        cfg=cfg)


def _stock_text(cfg: Config) -> str:
    return Config.pretty_text.fget(cfg)


def test_a_runner_start_formats_its_config_once_per_content(
        tmp_path, format_calls):
    """Once for the log, the visualizer and the dump: the logged config
    already has the 'mmddp_ext' the dump adds to custom_imports
    (dino_tiny.py sets none)."""
    cfg = Config.fromfile(CONFIG)
    assert 'custom_imports' not in cfg
    runner = _start_runner(str(tmp_path), cfg)
    assert isinstance(runner.cfg, FormattedOnceConfig)
    assert len(format_calls) == 1
    with open(osp.join(str(tmp_path), 'dino_tiny.py')) as f:
        dumped = f.read()
    assert "'mmddp_ext'" in dumped
    assert dumped == runner.cfg.pretty_text == _stock_text(runner.cfg)
    assert len(format_calls) == 2  # _stock_text's own
    assert 'custom_imports' not in cfg  # the caller's config untouched


def test_without_it_a_runner_start_formats_its_config_each_time(
        tmp_path, format_calls, monkeypatch):
    """Negative control: with Config's own pretty_text the same start
    formats the same text three times or more (log, visualizer, dump)."""
    monkeypatch.setattr(FormattedOnceConfig, 'pretty_text',
                        Config.pretty_text)
    _start_runner(str(tmp_path), Config.fromfile(CONFIG))
    assert len(format_calls) >= 3


def test_a_changed_config_is_formatted_again(format_calls):
    cfg = FormattedOnceConfig.of(Config.fromfile(CONFIG))
    first = cfg.pretty_text
    assert cfg.pretty_text is first
    assert len(format_calls) == 1
    cfg.train_cfg.max_iters = 7  # a nested key
    changed = cfg.pretty_text
    assert len(format_calls) == 2
    assert changed != first and 'max_iters=7' in changed
    assert changed == _stock_text(cfg)


def test_copies_and_pickles_keep_the_class_and_the_text():
    cfg = FormattedOnceConfig.of(Config.fromfile(CONFIG))
    text = cfg.pretty_text
    for other in (copy.deepcopy(cfg), copy.copy(cfg),
                  pickle.loads(pickle.dumps(cfg))):
        assert isinstance(other, FormattedOnceConfig)
        assert other.pretty_text == text


def test_unformatted_configs_and_dicts():
    plain = Config(dict(a=dict(b=1)), format_python_code=False)
    assert FormattedOnceConfig.of(plain).pretty_text == _stock_text(plain)
    from_dict = FormattedOnceConfig.of(dict(a=1))
    assert isinstance(from_dict, FormattedOnceConfig) and from_dict.a == 1
    assert FormattedOnceConfig.of(from_dict) is from_dict


def _starts_on_this_rank(work_dir: str) -> dict:
    """Start an ExtRunner on this rank three times: at INFO, at DEBUG (one
    log file per rank), and at INFO with ``Runner``'s own ``_log_env``
    (the control); the yapf calls of each start and its log text."""
    import glob

    import mmengine.config.config as config_module
    from mmengine.dist import get_rank
    from mmengine.runner import Runner
    calls = []
    real = config_module.FormatCode

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    config_module.FormatCode = counted
    starts = {}
    for name, level, log_env in (('info', 'INFO', None),
                                 ('debug', 'DEBUG', None),
                                 ('stock', 'INFO', Runner._log_env)):
        del calls[:]
        if log_env is not None:
            ExtRunner._log_env = log_env
        ExtRunner(model=ToyModel(), work_dir=osp.join(work_dir, name),
                  experiment_name=name, cfg=Config.fromfile(CONFIG),
                  launcher='pytorch', log_level=level)
        logs = glob.glob(osp.join(work_dir, name, '*', '*.log'))
        own = [p for p in logs if f'rank{get_rank()}' in p] or (
            logs if get_rank() == 0 else [])
        text = ''.join(open(p).read() for p in own)
        starts[name] = dict(calls=len(calls), config_logged='Config:' in text)
    return starts


def test_a_rank_that_logs_no_info_formats_no_config(tmp_path):
    """On 2 gloo ranks: rank 1's MMEngine logger shows no INFO (errors on
    its stream, no file), so its start formats nothing; rank 0 formats as
    before and logs the config; at DEBUG rank 1 writes its own log and
    formats for it. Control: ``Runner``'s ``_log_env`` formats the config
    on rank 1 for nothing."""
    from mmddp_ext.testing import run_on_ranks
    rank0, rank1 = run_on_ranks(_starts_on_this_rank, 2,
                                args=(str(tmp_path), ), timeout=120)
    assert rank0['info'] == dict(calls=1, config_logged=True)
    assert rank1['info'] == dict(calls=0, config_logged=False)
    assert rank1['debug']['calls'] >= 1 and rank1['debug']['config_logged']
    assert rank1['stock'] == dict(calls=1, config_logged=False)
