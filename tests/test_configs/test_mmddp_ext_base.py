"""The opt-in recipe ``configs/_base_/mmddp_ext.py`` on top of configs whose
bases set custom_imports, model_wrapper_cfg, find_unused_parameters,
custom_hooks or runner_type (issue 13)."""
import os.path as osp
import sys
import threading

import pytest
from mmengine.config import Config

from mmddp_ext.testing import run_command

from ..helpers import REPO_ROOT

RECIPE = osp.join(REPO_ROOT, 'configs', '_base_', 'mmddp_ext.py')

# A projects/-style package: registers its own model and hook, imported
# through custom_imports like every MMDet projects/ config.
TOY_PACKAGE = '''
import torch.nn as nn
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.registry import HOOKS, MODELS


@MODELS.register_module()
class RecipeToyModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs=None, data_samples=None, mode='tensor'):
        return self.linear(inputs)


@HOOKS.register_module()
class RecipeToyHook(Hook):
    pass
'''

USER_BASE = '''
custom_imports = dict(imports=['recipe_toyproj'], allow_failed_imports=False)
default_scope = 'mmengine'
model = dict(type='RecipeToyModel')
model_wrapper_cfg = dict(
    type='MMDistributedDataParallel', find_unused_parameters=True)
find_unused_parameters = True
custom_hooks = [dict(type='RecipeToyHook')]
'''

# The old recipe: the base file set custom_imports itself.
OLD_RECIPE = '''
custom_imports = dict(imports=['mmddp_ext'], allow_failed_imports=False)
runner_type = 'ExtRunner'
'''


def write_user_config(tmp_path, recipe=RECIPE, user_base=USER_BASE):
    """A user config ``_base_ = [<their base>, recipe]``; returns its path.
    The package directory is ``tmp_path / 'pkg'``."""
    pkg = tmp_path / 'pkg' / 'recipe_toyproj'
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / '__init__.py').write_text(TOY_PACKAGE)
    (tmp_path / 'user_base.py').write_text(user_base)
    leaf = tmp_path / 'user_config.py'
    leaf.write_text(f'_base_ = [\'./user_base.py\', {str(recipe)!r}]\n')
    return str(leaf)


@pytest.fixture
def toy_on_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path / 'pkg'))


def test_recipe_keeps_the_keys_of_the_users_config(tmp_path, toy_on_path):
    cfg = Config.fromfile(write_user_config(tmp_path))
    assert cfg.custom_imports == dict(
        imports=['recipe_toyproj'], allow_failed_imports=False)
    assert cfg.model_wrapper_cfg.find_unused_parameters is True
    assert cfg.find_unused_parameters is True
    assert cfg.custom_hooks == [dict(type='RecipeToyHook')]
    assert cfg.runner_type == 'ExtRunner'
    assert cfg.mmddp_ext_cfg.auto_ddp is True
    # The expression that imports mmddp_ext leaves no key behind.
    assert not [key for key in cfg if 'mmddp_ext_module' in key]

    from mmengine.registry import RUNNERS
    cfg.work_dir = str(tmp_path / 'work')
    runner = RUNNERS.build(cfg)
    assert type(runner).__name__ == 'ExtRunner'
    hooks = [type(hook).__name__ for hook in runner.hooks]
    assert 'RecipeToyHook' in hooks  # the user's custom_hooks
    assert 'SafeCheckpointHook' in hooks  # added by ExtRunner
    assert runner.cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
    assert runner.cfg.custom_imports.imports == ['recipe_toyproj', 'mmddp_ext']


def test_old_recipe_fails_on_a_base_with_custom_imports(tmp_path, toy_on_path):
    """Negative control: what users saw with a base file that set
    custom_imports."""
    old = tmp_path / 'old_mmddp_ext.py'
    old.write_text(OLD_RECIPE)
    with pytest.raises(KeyError, match="Duplicate key.*'custom_imports'"):
        Config.fromfile(write_user_config(tmp_path, recipe=old))


def test_base_setting_runner_type_is_refused_with_instructions(
        tmp_path, toy_on_path, monkeypatch):
    # parse_args exports LOCAL_RANK, as MMDetection's train.py does; the
    # monkeypatch takes it out of the environment again afterwards.
    monkeypatch.setenv('LOCAL_RANK', '0')
    sys.path.insert(0, osp.join(REPO_ROOT, 'tools'))
    try:
        from train import load_cfg, parse_args
    finally:
        sys.path.remove(osp.join(REPO_ROOT, 'tools'))
    config = write_user_config(
        tmp_path, user_base=USER_BASE + "runner_type = 'Runner'\n")
    with pytest.raises(KeyError, match='Duplicate key'):
        Config.fromfile(config)  # what MMDetection's own tools show
    with pytest.raises(ValueError) as error:
        load_cfg(parse_args([config]))
    assert 'runner_type' in str(error.value)
    assert "runner_type = 'ExtRunner'" in str(error.value)
    assert 'custom_imports.imports' in str(error.value)


FRESH_NEGATIVE = '''
import sys
from mmengine.config import Config
from mmengine.registry import RUNNERS
stock, recipe = sys.argv[1:]
# Negative control, as MMDetection's tools/test.py does it: Config.fromfile,
# then RUNNERS.build because the config names a runner_type.
cfg = Config.fromfile(stock)
try:
    RUNNERS.build(cfg)
except KeyError as error:
    print('STOCK DUMP FAILS:', error)
assert 'mmddp_ext' not in sys.modules
# Reading the recipe config imports both: the user's custom_imports and
# mmddp_ext (through the base file's expression).
Config.fromfile(recipe)
print('RECIPE IMPORTS', sorted(m for m in sys.modules
                               if m in ('recipe_toyproj', 'mmddp_ext')))
'''

FRESH_RELOAD = '''
import sys
from mmengine.config import Config
from mmengine.registry import RUNNERS
dumped, work_dir = sys.argv[1:]
cfg = Config.fromfile(dumped)
cfg.work_dir = work_dir
print('RELOADED', type(RUNNERS.build(cfg)).__name__)
'''


def _python(script, args, env, results, name):
    results[name] = run_command(
        [sys.executable, str(script), *args],
        timeout=150,
        env=env,
        check=False)


def test_dumped_config_reloads_in_a_fresh_interpreter(tmp_path, toy_on_path):
    from mmengine.registry import RUNNERS
    config = write_user_config(tmp_path)
    cfg = Config.fromfile(config)
    # What stock Runner.dump_config writes (no mmddp_ext in custom_imports).
    stock = tmp_path / 'stock_dump.py'
    cfg.dump(str(stock))
    cfg.work_dir = str(tmp_path / 'work')
    RUNNERS.build(cfg)
    dumped = tmp_path / 'work' / 'user_config.py'
    text = dumped.read_text()
    assert "'recipe_toyproj'" in text and "'mmddp_ext'" in text

    # Two fresh interpreters, side by side.
    env = {'PYTHONPATH': f'{tmp_path / "pkg"}:{REPO_ROOT}'}
    results = {}
    runs = []
    for name, source, args in (
        ('negative', FRESH_NEGATIVE, [str(stock), config]),
        ('reload', FRESH_RELOAD, [str(dumped),
                                  str(tmp_path / 'work2')]),
    ):
        script = tmp_path / f'{name}.py'
        script.write_text(source)
        runs.append(
            threading.Thread(
                target=_python, args=(script, args, env, results, name)))
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    out = results['negative'].stdout
    assert results['negative'].returncode == 0, out[-3000:]
    failure = out.split('STOCK DUMP FAILS:')[1].splitlines()[0]
    assert 'ExtRunner is not in' in failure
    assert "RECIPE IMPORTS ['mmddp_ext', 'recipe_toyproj']" in out
    out = results['reload'].stdout
    assert 'RELOADED ExtRunner' in out, out[-3000:]
