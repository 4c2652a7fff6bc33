"""``mmddp_ext.testing.upstream_checkout`` on a made-up checkout laid out
as upstream's (a package whose ``__init__`` imports a training stack that
is not installed, a model module importing torchvision's ``box_area``):
the model modules import, the ``__init__`` files do not run, and YAML
configs build through the checkout's own registry."""
import sys
import textwrap

import pytest
import torch

from mmddp_ext.testing.upstream_checkout import (build_from_yaml,
                                                 load_model_modules)

PACKAGES = ('fakeup', 'fakeup.core', 'fakeup.misc', 'fakeup.zoo')
FILES = {
    # what upstream's __init__ files do: import the whole training stack
    'fakeup/__init__.py':
    'import a_training_stack_not_installed\n',
    'fakeup/core/__init__.py':
    'import a_training_stack_not_installed\n',
    'fakeup/misc/__init__.py':
    'import a_training_stack_not_installed\n',
    'fakeup/zoo/__init__.py':
    'import a_training_stack_not_installed\n',
    'fakeup/misc/dist_utils.py':
    'import a_training_stack_not_installed\n',
    'fakeup/core/workspace.py':
    '''
        GLOBAL_CONFIG = {}

        def register(cls):
            GLOBAL_CONFIG[cls.__name__] = cls
            return cls

        def create(cfg, global_cfg):
            cfg = dict(cfg)
            return GLOBAL_CONFIG[cfg.pop('type')](**cfg)
        ''',
    'fakeup/core/yaml_utils.py':
    '''
        import yaml

        def load_config(path):
            with open(path) as f:
                return yaml.safe_load(f)

        def merge_dict(cfg, other):
            return dict(cfg, **other)

        def merge_config(cfg, inplace=False, overwrite=False):
            return cfg
        ''',
    'fakeup/zoo/model.py':
    '''
        import torch
        from torchvision.ops.boxes import box_area

        from ..core import register
        from ..misc.dist_utils import get_world_size

        @register
        class Model(torch.nn.Module):
            def __init__(self, width):
                super().__init__()
                self.fc = torch.nn.Linear(width, width)

        @register
        class Criterion:
            def __init__(self):
                self.world_size = get_world_size()

            def area(self, boxes):
                return box_area(boxes)
        ''',
}


@pytest.fixture
def checkout(tmp_path):
    for path, text in FILES.items():
        target = tmp_path / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(textwrap.dedent(text))
    (tmp_path / 'model.yml').write_text(
        'model: {type: Model, width: 3}\ncriterion: {type: Criterion}\n')
    before = set(sys.modules)
    yield tmp_path
    # the checkout's modules and the torchvision stub leave with the test
    for name in set(sys.modules) - before:
        if name.split('.')[0] in ('fakeup', 'torchvision'):
            del sys.modules[name]


def test_builds_from_yaml_without_the_training_stack(checkout):
    stubbed = 'torchvision' not in sys.modules
    upstream = load_model_modules(
        str(checkout), 'fakeup', PACKAGES, ['fakeup.zoo.model'], 'fakeup/zoo',
        'example/fakeup')
    assert set(upstream.modules) == {'fakeup.zoo.model'}
    built = build_from_yaml(
        upstream,
        str(checkout / 'model.yml'),
        overrides={'model': {
            'type': 'Model',
            'width': 5
        }})
    assert built['model'].fc.in_features == 5  # the override merged
    assert built['criterion'].world_size == 1  # dist_utils as upstream's
    boxes = torch.tensor([[0., 0., 2., 3.], [1., 1., 2., 5.]])
    if stubbed:  # torchvision's formula
        assert built['criterion'].area(boxes).tolist() == [6., 4.]
    assert str(checkout) not in sys.path


def test_another_folder_is_named_with_the_fix(tmp_path):
    with pytest.raises(ValueError) as err:
        load_model_modules(
            str(tmp_path), 'fakeup', PACKAGES, [], 'fakeup/zoo',
            'example/fakeup')
    assert 'is not a checkout of example/fakeup (no fakeup/zoo)' in str(
        err.value)
    assert 'Pass the root of a checkout' in str(err.value)
