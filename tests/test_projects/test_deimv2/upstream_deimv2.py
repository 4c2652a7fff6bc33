"""Build official DEIMv2 models from an upstream checkout, in this process.

Used by ``data/make_upstream_manifests.py`` (the key/shape manifests the
conversion tests compare with). Nothing here is needed by the port.

Upstream's package ``engine`` imports its whole training stack from its
``__init__`` files (datasets, torchvision transforms, the solvers). Model
construction needs none of it, so the packages are created empty (their
``__init__`` files are not run) and only the modules a model and its
criterion live in are imported, as ``test_dfine/upstream_dfine.py`` does
for D-FINE. The imports of torchvision those modules make at import time
are stubbed:

- ``torchvision.ops.boxes.box_area``: ``(x2 - x1) * (y2 - y1)`` of (N, 4)
  xyxy boxes, torchvision's formula;
- the names ``deim_criterion`` / ``postprocessor`` reach through
  ``import torchvision`` raise if called (the manifests run no loss).

``engine.misc.dist_utils`` imports upstream's data loaders; the criterion
takes two functions from it, given here as upstream defines them.
"""
import importlib
import os.path as osp
import sys
import types
from typing import Dict, Optional

PACKAGES = ('engine', 'engine.core', 'engine.backbone', 'engine.deim',
            'engine.misc')
MODEL_MODULES = ('engine.backbone.hgnetv2', 'engine.backbone.dinov3_adapter',
                 'engine.deim.hybrid_encoder', 'engine.deim.lite_encoder',
                 'engine.deim.deim_decoder', 'engine.deim.deim_criterion',
                 'engine.deim.matcher', 'engine.deim.deim')


def _box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def _not_stubbed(name: str):

    def call(*args, **kwargs):
        raise RuntimeError(
            f'torchvision.{name} is stubbed (torchvision is not installed); '
            'the manifest run does not use it.')

    return call


def _install_torchvision_stub() -> None:
    if 'torchvision' in sys.modules:
        return
    names = ('torchvision', 'torchvision.ops', 'torchvision.ops.boxes')
    modules = {name: types.ModuleType(name) for name in names}
    modules['torchvision'].ops = modules['torchvision.ops']
    modules['torchvision.ops'].boxes = modules['torchvision.ops.boxes']
    modules['torchvision.ops.boxes'].box_area = _box_area
    for name in ('sigmoid_focal_loss', 'box_convert'):
        setattr(modules['torchvision.ops'], name, _not_stubbed(f'ops.{name}'))
    sys.modules.update(modules)


def _dist_utils_stub() -> types.ModuleType:
    import torch.distributed as dist
    module = types.ModuleType('engine.misc.dist_utils')
    module.is_dist_available_and_initialized = (
        lambda: dist.is_available() and dist.is_initialized())
    module.get_world_size = (
        lambda: dist.get_world_size()
        if module.is_dist_available_and_initialized() else 1)
    sys.modules['engine.misc.dist_utils'] = module
    return module


def load_upstream(root: str) -> types.SimpleNamespace:
    """Import DEIMv2's model modules from the checkout at ``root``.

    Returns:
        SimpleNamespace: ``workspace`` and ``yaml_utils`` (upstream's
        registry and YAML loader) and ``modules`` (name -> module of
        :data:`MODEL_MODULES`).
    """
    if not osp.isdir(osp.join(root, 'engine', 'deim')):
        raise ValueError(
            f'{root} is not a DEIMv2 checkout (no engine/deim). Pass the '
            'root of github.com/Intellindust-AI-Lab/DEIMv2.')
    for name in [
            m for m in sys.modules if m == 'engine' or m.startswith('engine.')
    ]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        for name in PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [osp.join(root, *name.split('.'))]
            sys.modules[name] = package
        _install_torchvision_stub()
        core = sys.modules['engine.core']
        workspace = importlib.import_module('engine.core.workspace')
        yaml_utils = importlib.import_module('engine.core.yaml_utils')
        core.register = workspace.register
        core.GLOBAL_CONFIG = workspace.GLOBAL_CONFIG
        sys.modules['engine.misc'].dist_utils = _dist_utils_stub()
        modules = {
            name: importlib.import_module(name)
            for name in MODEL_MODULES
        }
    finally:
        sys.path.remove(root)
    return types.SimpleNamespace(
        workspace=workspace, yaml_utils=yaml_utils, modules=modules)


def build_from_yaml(upstream: types.SimpleNamespace,
                    config: str,
                    overrides: Optional[Dict] = None) -> Dict:
    """Build ``model`` and ``criterion`` of one upstream YAML config as
    upstream's ``YAMLConfig`` does (``load_config``, then ``create``
    against ``merge_config(cfg)``). Call it once per process (upstream's
    ``load_config`` keeps merged includes in a default argument).

    Args:
        upstream: What :func:`load_upstream` returned.
        config (str): Path of the YAML file.
        overrides (dict, optional): Merged over the loaded config, as
            upstream's command-line ``-u`` updates. Defaults to None.

    Returns:
        dict: ``model``, ``criterion`` and ``cfg``.
    """
    yaml_utils, workspace = upstream.yaml_utils, upstream.workspace
    cfg = yaml_utils.load_config(config)
    cfg = yaml_utils.merge_dict(cfg, overrides or {})
    global_cfg = yaml_utils.merge_config(cfg, inplace=False, overwrite=False)
    model = workspace.create(cfg['model'], global_cfg)
    criterion = workspace.create(cfg['criterion'], global_cfg)
    return dict(model=model, criterion=criterion, cfg=cfg)
