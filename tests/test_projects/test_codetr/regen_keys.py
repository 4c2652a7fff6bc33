r"""Regenerate (or check) the CO-DINO pins from upstream's own code and
configs: the state-dict key/shape lists and the per-parameter lr and
weight decay.

    python tests/test_projects/test_codetr/regen_keys.py UPSTREAM_ROOT \
        --source 'open-mmlab/mmdetection@<commit>' [--check]

``UPSTREAM_ROOT`` is a tree with upstream's ``projects/CO-DETR`` (an
open-mmlab/mmdetection checkout, or a verbatim copy of its
``projects/CO-DETR``); ``--source`` names where it came from, for the
files' headers (default: ``git rev-parse HEAD`` of the root). Upstream's
``projects/CO-DETR/codetr`` is imported from there (never the port: the
two register the same names) and builds upstream's own config files,
with mmdet's installed model zoo for their ``mmdet::`` bases:

  r50     projects/CO-DETR/configs/codino/co_dino_5scale_r50_8xb2_1x_coco.py
  swin_l  projects/CO-DETR/configs/codino/
          co_dino_5scale_swin_l_16xb1_1x_coco.py

Each pin is the state dict (key and shape, in order) of that model.
``co_dino_upstream_param_groups.json`` holds, for every upstream codino
config, the (lr, weight decay) that MMEngine's
``DefaultOptimWrapperConstructor`` (the rule code upstream trains with)
gives each trainable parameter from the config's ``optim_wrapper``.
Backbone and neck are mmdet's own ResNet/SwinTransformer and
ChannelMapper. Models are built on the CPU with upstream's weight
initialisation (about a minute for the Swin-L ones); nothing downloads
(``init_cfg`` of the backbone is dropped).

The tests (``test_state_dict_keys.py``, ``test_codino_param_groups.py``)
build the port's configs and compare them with these files.
"""
import argparse
import contextlib
import importlib
import json
import os.path as osp
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

HERE = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(HERE)))
CODINO_CONFIGS = osp.join(REPO_ROOT, 'projects', 'CO-DETR', 'configs',
                          'codino')
UPSTREAM_CODINO = osp.join('projects', 'CO-DETR', 'configs', 'codino')
#: name -> (upstream config under UPSTREAM_CODINO, pin file, title)
PINS = {
    'r50': ('co_dino_5scale_r50_8xb2_1x_coco.py',
            osp.join(HERE, 'co_dino_5scale_r50_keys.txt'),
            'CO-DINO 5-scale R50 (80 classes, 900 queries, 6+6 layers, '
            '2 auxiliary heads)'),
    'swin_l': ('co_dino_5scale_swin_l_16xb1_1x_coco.py',
               osp.join(HERE, 'co_dino_5scale_swin_l_keys.txt'),
               'CO-DINO 5-scale Swin-L (mmdet SwinTransformer, embed 192, '
               'depths 2-2-18-2, window 12; 80 classes, 900 queries, 6+6 '
               'layers, 2 auxiliary heads)'),
}
PARAM_GROUPS = osp.join(HERE, 'co_dino_upstream_param_groups.json')
#: upstream codino configs whose optimizer the param-group file records
UPSTREAM_CONFIGS = [
    'co_dino_5scale_r50_8xb2_1x_coco.py',
    'co_dino_5scale_r50_lsj_8xb2_1x_coco.py',
    'co_dino_5scale_r50_lsj_8xb2_3x_coco.py',
    'co_dino_5scale_swin_l_16xb1_1x_coco.py',
    'co_dino_5scale_swin_l_16xb1_3x_coco.py',
    'co_dino_5scale_swin_l_lsj_16xb1_1x_coco.py',
    'co_dino_5scale_swin_l_lsj_16xb1_3x_coco.py',
    'co_dino_5scale_swin_l_16xb1_16e_o365tococo.py',
]
COMMAND = ('python tests/test_projects/test_codetr/regen_keys.py '
           '<upstream root> --source <where it came from>')

Entry = Tuple[str, Tuple[int, ...]]


def import_implementation(upstream_root: Optional[str] = None):
    """Register mmdet's modules and the CO-DETR code: upstream's from
    ``upstream_root``, or the port's (never both: they share names)."""
    from mmdet.utils import register_all_modules
    register_all_modules()
    root = upstream_root or REPO_ROOT
    if root not in sys.path:
        sys.path.insert(0, root)
    if upstream_root is None:
        importlib.import_module('mmddp_ext')
    return importlib.import_module('projects.CO-DETR.codetr')


def load_model_cfg(config: str):
    """``model`` of ``config`` without the backbone download."""
    from mmengine.config import Config
    cfg = Config.fromfile(config, import_custom_modules=False)
    cfg.model.backbone.init_cfg = None
    return cfg


def build_model(config: str, on_meta: bool = True):
    """The model of ``config``, built without weights (``on_meta``) or on
    the CPU (upstream's code initialises weights while building, which
    meta tensors cannot do)."""
    from mmdet.registry import MODELS

    from mmddp_ext.testing import weights_on_meta
    cfg = load_model_cfg(config)
    with weights_on_meta() if on_meta else contextlib.nullcontext():
        return MODELS.build(cfg.model)


def build_entries(config: str, on_meta: bool = True) -> List[Entry]:
    """(key, shape) of the model of ``config``."""
    return [
        (key, tuple(value.shape))
        for key, value in build_model(config, on_meta).state_dict().items()
    ]


def param_values(model, optim_wrapper_cfg) -> Dict[str, List[float]]:
    """``{name: [lr, weight_decay]}`` of every trainable parameter in the
    optimizer MMEngine builds for ``model`` from ``optim_wrapper_cfg``."""
    from mmengine.optim import build_optim_wrapper
    wrapper = build_optim_wrapper(model, optim_wrapper_cfg)
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {
        name_of[id(param)]: [group['lr'], group['weight_decay']]
        for group in wrapper.optimizer.param_groups
        for param in group['params'] if param.requires_grad
    }


def read_pin(path: str) -> List[Entry]:
    """(key, shape) per line of a pinned list; '#' lines are comments."""
    entries = []
    with open(path) as f:
        for line in f:
            line = line.rstrip('\n')
            if not line or line.startswith('#'):
                continue
            key, shape = line.rsplit(' ', 1)
            dims = tuple(int(d) for d in shape.split(',')) if shape else ()
            entries.append((key, dims))
    return entries


def write_pin(path: str, title: str, config: str, source: str,
              entries: List[Entry]) -> None:
    header = [
        f'State-dict keys and shapes of {title},',
        "built by upstream's own projects/CO-DETR/codetr from upstream's",
        f'{UPSTREAM_CODINO}/{config}',
        f'(source: {source}; mmdet 3.3.0, mmcv 2.1.0 installed).',
        f'Regenerate: {COMMAND}',
        "One 'key dim,dim,...' per line (empty shape: a scalar).",
    ]
    with open(path, 'w') as f:
        f.writelines(f'# {line}\n' for line in header)
        f.writelines(f"{key} {','.join(map(str, shape))}\n"
                     for key, shape in entries)


def upstream_param_groups(root: str, source: str) -> dict:
    """The param-group file's content: for each upstream config, its
    trainable parameters by their (lr, weight decay)."""
    from mmengine.config import Config
    data = dict(
        source=dict(
            code=source,
            configs=f'{UPSTREAM_CODINO}/*.py of the same tree',
            rule='mmengine 0.10.7 DefaultOptimWrapperConstructor with '
            "each config's optim_wrapper",
            command=COMMAND),
        configs={})
    for name in UPSTREAM_CONFIGS:
        path = osp.join(root, UPSTREAM_CODINO, name)
        cfg = Config.fromfile(path, import_custom_modules=False)
        values = param_values(
            build_model(path, on_meta=False), cfg.optim_wrapper)
        by_values: Dict[tuple, List[str]] = {}
        for param, pair in values.items():
            by_values.setdefault(tuple(pair), []).append(param)
        data['configs'][name] = [
            dict(lr=lr, weight_decay=wd, params=params)
            for (lr, wd), params in by_values.items()
        ]
        print(f'{name}: ' + ', '.join(f'{len(p)} with lr {lr}, wd {wd}'
                                      for (lr, wd), p in by_values.items()))
    return data


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'upstream_root',
        help="a tree with upstream's projects/CO-DETR (mmdetection "
        'checkout or a verbatim copy)')
    parser.add_argument(
        '--source', help='where the tree came from, for the headers')
    parser.add_argument('--only', choices=sorted(PINS))
    parser.add_argument(
        '--check',
        action='store_true',
        help='compare with the pinned lists, write nothing')
    args = parser.parse_args()
    root = osp.abspath(args.upstream_root)
    source = args.source or _git_head(root)
    import_implementation(root)
    failed = False
    for name in ([args.only] if args.only else sorted(PINS)):
        config, path, title = PINS[name]
        entries = build_entries(
            osp.join(root, UPSTREAM_CODINO, config), on_meta=False)
        if args.check:
            same = entries == read_pin(path)
            failed |= not same
            print(f'{name}: {len(entries)} keys, '
                  f"{'matches' if same else 'DIFFERS FROM'} {path}")
        else:
            write_pin(path, title, config, source, entries)
            print(f'{name}: wrote {len(entries)} keys to {path}')
    if not args.check and not args.only:
        with open(PARAM_GROUPS, 'w') as f:
            json.dump(upstream_param_groups(root, source), f, indent=1)
            f.write('\n')
        print(f'wrote {PARAM_GROUPS}')
    return int(failed)


def _git_head(root: str) -> str:
    head = subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'],
                          capture_output=True,
                          text=True)
    if head.returncode:
        raise SystemExit(f'{root} is no git checkout: name its origin with '
                         "--source 'owner/repo@commit (path)'.")
    return f'{root} at commit {head.stdout.strip()}'


if __name__ == '__main__':
    sys.exit(main())
