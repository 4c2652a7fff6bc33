"""Build an upstream repository's own model and criterion from a checkout,
in this process, for the comparisons with upstream's code (key
manifests, recipe records, equivalence benchmarks). The ports need none of
it.

D-FINE (package ``src``) and DEIM / DEIMv2 (package ``engine``) import
their whole training stack from their ``__init__`` files (datasets,
torchvision transforms, tensorboard, COCO evaluation). Building a model
needs none of that, so :func:`load_model_modules` creates the packages
empty (their ``__init__`` files are not run) and imports only the modules
a model and its criterion live in. What those modules import at import
time and a model build never runs is stubbed:

- when torchvision is not installed, ``torchvision.ops.boxes.box_area``
  (``(x2 - x1) * (y2 - y1)`` of (N, 4) xyxy boxes, torchvision's formula,
  used by upstream's ``box_iou`` in the criterion); ``ops.sigmoid_focal_loss``
  and ``ops.box_convert`` raise if called (not in these recipes; the
  post-processor is not run);
- ``<package>.misc.dist_utils`` (it imports upstream's data loaders): the
  two functions the criterion takes from it, as upstream defines them
  (``is_dist_available_and_initialized``, ``get_world_size``).
"""
import importlib
import os.path as osp
import sys
import types
from typing import Dict, Optional, Sequence


def _box_area(boxes):
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def _not_stubbed(name: str):

    def call(*args, **kwargs):
        raise RuntimeError(
            f'torchvision.{name} is stubbed (torchvision is not installed); '
            'building an upstream model does not use it.')

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


def _dist_utils_stub(package: str) -> types.ModuleType:
    import torch.distributed as dist
    module = types.ModuleType(f'{package}.misc.dist_utils')
    module.is_dist_available_and_initialized = (
        lambda: dist.is_available() and dist.is_initialized())
    module.get_world_size = (
        lambda: dist.get_world_size()
        if module.is_dist_available_and_initialized() else 1)
    sys.modules[module.__name__] = module
    return module


def load_model_modules(root: str, package: str, packages: Sequence[str],
                       modules: Sequence[str], marker: str,
                       repository: str) -> types.SimpleNamespace:
    """Import an upstream checkout's model modules, its training stack
    left out (see the module docstring). Modules of ``package`` imported
    before (another checkout's) are dropped first.

    Args:
        root (str): The checkout.
        package (str): Its top-level package (``'src'``, ``'engine'``).
        packages (Sequence[str]): Packages created empty, ``package``,
            ``<package>.core`` and ``<package>.misc`` among them.
        modules (Sequence[str]): Modules to import, by full name.
        marker (str): A folder every checkout of ``repository`` has,
            relative to ``root`` (``'src/zoo/dfine'``).
        repository (str): Named in the error for another folder
            (``'github.com/Peterande/D-FINE'``).

    Returns:
        SimpleNamespace: ``workspace`` and ``yaml_utils`` (upstream's
        registry and YAML loader) and ``modules`` (name -> module).

    Raises:
        ValueError: ``root`` has no ``marker`` folder.
    """
    if not osp.isdir(osp.join(root, marker)):
        raise ValueError(
            f'{root} is not a checkout of {repository} (no {marker}). Pass '
            f'the root of a checkout of {repository}.')
    for name in [
            m for m in sys.modules
            if m == package or m.startswith(package + '.')
    ]:
        del sys.modules[name]
    sys.path.insert(0, root)
    try:
        for name in packages:
            module = types.ModuleType(name)
            module.__path__ = [osp.join(root, *name.split('.'))]
            sys.modules[name] = module
        _install_torchvision_stub()
        core = sys.modules[f'{package}.core']
        workspace = importlib.import_module(f'{package}.core.workspace')
        yaml_utils = importlib.import_module(f'{package}.core.yaml_utils')
        core.register = workspace.register
        core.GLOBAL_CONFIG = workspace.GLOBAL_CONFIG
        sys.modules[f'{package}.misc'].dist_utils = _dist_utils_stub(package)
        imported = {name: importlib.import_module(name) for name in modules}
    finally:
        sys.path.remove(root)
    return types.SimpleNamespace(
        workspace=workspace, yaml_utils=yaml_utils, modules=imported)


def build_from_yaml(upstream: types.SimpleNamespace,
                    config: str,
                    overrides: Optional[Dict] = None) -> Dict:
    """Build ``model`` and ``criterion`` of one upstream YAML config as
    upstream's ``YAMLConfig`` does (``load_config``, then ``create``
    against ``merge_config(cfg)``).

    Call it once per process: upstream's ``load_config`` keeps the merged
    includes in a default argument and ``create`` edits the registered
    schemas, so a second config in the same process would inherit the
    first one's keys.

    Args:
        upstream: What :func:`load_model_modules` returned (or a namespace
            with its ``workspace`` and ``yaml_utils``).
        config (str): Path of the YAML file.
        overrides (dict, optional): Merged over the loaded config, as
            upstream's command-line ``-u`` updates (e.g.
            ``{'HGNetv2': {'pretrained': False}}``). Defaults to None.

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
