"""Build official D-FINE models from an upstream checkout, in this process.

Used by ``data/make_upstream_manifests.py`` (the key/shape manifests the
conversion tests compare with) and ``benchmarks/dfine_vs_upstream.py``
(numerical equivalence and speed). Nothing here is needed by the port.

Upstream's package ``src`` imports its whole training stack from its
``__init__`` files (datasets, torchvision transforms, tensorboard,
faster-coco-eval). Model construction needs none of it, so the packages are
created empty (their ``__init__`` files are not run) and only the modules a
model, its criterion and its matcher live in are imported. The one import
of torchvision those modules make at import time is stubbed:

- ``torchvision.ops.boxes.box_area``: ``(x2 - x1) * (y2 - y1)`` of (N, 4)
  xyxy boxes, torchvision's formula, used by upstream's ``box_iou`` in the
  criterion;
- the names ``dfine_criterion`` / ``postprocessor`` reach through
  ``import torchvision`` (``ops.sigmoid_focal_loss``, ``ops.box_convert``)
  raise if called: the focal loss is not in the D-FINE recipe and the
  post-processor is not run.

``src.misc.dist_utils`` imports upstream's data loaders; the criterion
takes two functions from it, given here as upstream defines them
(``is_dist_available_and_initialized``, ``get_world_size``).
"""
import importlib
import os.path as osp
import sys
import types
from typing import Dict, Optional

PACKAGES = ('src', 'src.core', 'src.nn', 'src.nn.backbone', 'src.zoo',
            'src.misc')


def _box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def _not_stubbed(name: str):

    def call(*args, **kwargs):
        raise RuntimeError(
            f'torchvision.{name} is stubbed (torchvision is not installed); '
            'the equivalence run does not use it.')

    return call


def _install_torchvision_stub() -> None:
    if 'torchvision' in sys.modules:
        return
    names = ('torchvision', 'torchvision.ops', 'torchvision.ops.boxes')
    modules = {name: types.ModuleType(name) for name in names}
    modules['torchvision'].ops = modules['torchvision.ops']
    modules['torchvision.ops'].boxes = modules['torchvision.ops.boxes']
    modules['torchvision.ops.boxes'].box_area = _box_area
    modules['torchvision.ops'].sigmoid_focal_loss = _not_stubbed(
        'ops.sigmoid_focal_loss')
    modules['torchvision.ops'].box_convert = _not_stubbed('ops.box_convert')
    sys.modules.update(modules)


def _dist_utils_stub() -> types.ModuleType:
    import torch.distributed as dist
    module = types.ModuleType('src.misc.dist_utils')
    module.is_dist_available_and_initialized = (
        lambda: dist.is_available() and dist.is_initialized())
    module.get_world_size = (
        lambda: dist.get_world_size()
        if module.is_dist_available_and_initialized() else 1)
    sys.modules['src.misc.dist_utils'] = module
    return module


def load_upstream(root: str) -> types.SimpleNamespace:
    """Import D-FINE's model modules from the checkout at ``root``.

    Returns:
        SimpleNamespace: ``workspace`` and ``yaml_utils`` (upstream's
        registry and YAML loader), ``zoo`` (``src.zoo.dfine``'s modules
        ``dfine``, ``dfine_decoder``, ``hybrid_encoder``,
        ``dfine_criterion``, ``matcher``, ``denoising``, ``dfine_utils``)
        and ``hgnetv2``.
    """
    if not osp.isdir(osp.join(root, 'src', 'zoo', 'dfine')):
        raise ValueError(
            f'{root} is not a D-FINE checkout (no src/zoo/dfine). Pass the '
            'root of github.com/Peterande/D-FINE.')
    for name in [m for m in sys.modules if m == 'src' or m.startswith('src.')]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        for name in PACKAGES:
            package = types.ModuleType(name)
            package.__path__ = [osp.join(root, *name.split('.'))]
            sys.modules[name] = package
        _install_torchvision_stub()
        core = sys.modules['src.core']
        workspace = importlib.import_module('src.core.workspace')
        yaml_utils = importlib.import_module('src.core.yaml_utils')
        core.register = workspace.register
        core.GLOBAL_CONFIG = workspace.GLOBAL_CONFIG
        sys.modules['src.misc'].dist_utils = _dist_utils_stub()
        hgnetv2 = importlib.import_module('src.nn.backbone.hgnetv2')
        zoo = types.SimpleNamespace(
            **{
                name: importlib.import_module(f'src.zoo.dfine.{name}')
                for name in ('denoising', 'dfine_utils', 'dfine_decoder',
                             'hybrid_encoder', 'matcher', 'dfine_criterion',
                             'dfine')
            })
    finally:
        sys.path.remove(root)
    return types.SimpleNamespace(
        workspace=workspace, yaml_utils=yaml_utils, zoo=zoo, hgnetv2=hgnetv2)


def build_from_yaml(upstream: types.SimpleNamespace,
                    config: str,
                    overrides: Optional[Dict] = None) -> Dict:
    """Build ``model``, ``criterion`` and ``postprocessor`` of one upstream
    YAML config as upstream's ``YAMLConfig`` does (``load_config``, then
    ``create`` against ``merge_config(cfg)``).

    Call it once per process: upstream's ``load_config`` keeps the merged
    includes in a default argument and ``create`` edits the registered
    schemas, so a second config in the same process would inherit the
    first one's keys.

    Args:
        upstream: What :func:`load_upstream` returned.
        config (str): Path of the YAML file (e.g.
            ``configs/dfine/dfine_hgnetv2_n_coco.yml``).
        overrides (dict, optional): Merged over the loaded config, as
            upstream's command-line ``-u`` updates (e.g.
            ``{'HGNetv2': {'pretrained': False}}``). Defaults to None.

    Returns:
        dict: ``model`` (the DFINE module), ``criterion`` and ``cfg``.
    """
    yaml_utils, workspace = upstream.yaml_utils, upstream.workspace
    cfg = yaml_utils.load_config(config)
    cfg = yaml_utils.merge_dict(cfg, overrides or {})
    global_cfg = yaml_utils.merge_config(cfg, inplace=False, overwrite=False)
    model = workspace.create(cfg['model'], global_cfg)
    criterion = workspace.create(cfg['criterion'], global_cfg)
    return dict(model=model, criterion=criterion, cfg=cfg)
