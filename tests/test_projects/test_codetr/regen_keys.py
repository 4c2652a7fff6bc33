"""Regenerate (or check) the pinned CO-DINO state-dict key/shape lists.

    python tests/test_projects/test_codetr/regen_keys.py           # write
    python tests/test_projects/test_codetr/regen_keys.py --check   # compare
    python tests/test_projects/test_codetr/regen_keys.py \\
        --upstream-root /path/to/mmdetection --check

Each pin is the state dict (key and shape, in order) of a model built,
without weights, from a config with upstream's type names and
hyper-parameters:

  r50     configs/co_dino_ext.py (upstream's co_dino_5scale_r50 model)
  swin_l  projects/CO-DETR/configs/codino/
          co_dino_5scale_swin_l_16xb1_1x_coco.py

By default the port builds it. With ``--upstream-root`` (a checkout of
open-mmlab/mmdetection) upstream's own ``projects/CO-DETR/codetr`` builds
the same config instead, so ``--check`` then compares the pins with
upstream's code. Backbone and neck are mmdet's own ResNet/SwinTransformer
and ChannelMapper in both cases.
"""
import argparse
import contextlib
import importlib
import os.path as osp
import sys
from typing import List, Optional, Tuple

HERE = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(HERE)))
CODINO_CONFIGS = osp.join(REPO_ROOT, 'projects', 'CO-DETR', 'configs',
                          'codino')
# Upstream (open-mmlab/mmdetection projects/CO-DETR) sources the pinned
# structure was read from.
UPSTREAM_CODE = ('codetr/transformer.py @7ece1f0a, codetr/co_dino_head.py '
                 'and codetr/codetr.py @2a6903c0')
PINS = {
    'r50': (osp.join(REPO_ROOT, 'configs', 'co_dino_ext.py'),
            osp.join(HERE, 'co_dino_5scale_r50_keys.txt'),
            'CO-DINO 5-scale R50 (80 classes, 900 queries, 6+6 layers, '
            '2 auxiliary heads)',
            'configs/codino/co_dino_5scale_r50_8xb2_1x_coco.py @e0a6cf6a'),
    'swin_l': (osp.join(CODINO_CONFIGS,
                        'co_dino_5scale_swin_l_16xb1_1x_coco.py'),
               osp.join(HERE, 'co_dino_5scale_swin_l_keys.txt'),
               'CO-DINO 5-scale Swin-L (mmdet SwinTransformer, embed 192, '
               'depths 2-2-18-2, window 12; 80 classes, 900 queries, 6+6 '
               'layers, 2 auxiliary heads)',
               'configs/codino/co_dino_5scale_swin_l_16xb1_1x_coco.py '
               '@00ac6925'),
}

Entry = Tuple[str, Tuple[int, ...]]


def import_implementation(upstream_root: Optional[str] = None):
    """Register mmdet's modules and the CO-DETR code: the port's, or
    upstream's from ``upstream_root`` (never both: they share names)."""
    from mmdet.utils import register_all_modules
    register_all_modules()
    root = upstream_root or REPO_ROOT
    if root not in sys.path:
        sys.path.insert(0, root)
    if upstream_root is None:
        importlib.import_module('mmddp_ext')
    return importlib.import_module('projects.CO-DETR.codetr')


def build_entries(config: str, on_meta: bool = True) -> List[Entry]:
    """(key, shape) of the model of ``config``, built without weights
    (``on_meta``) or on the CPU (upstream's code initialises weights while
    building, which meta tensors cannot do)."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    cfg = Config.fromfile(config, import_custom_modules=False).model
    cfg.backbone.init_cfg = None  # no download
    from mmddp_ext.testing import weights_on_meta
    with weights_on_meta() if on_meta else contextlib.nullcontext():
        model = MODELS.build(cfg)
    return [(key, tuple(value.shape))
            for key, value in model.state_dict().items()]


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


def write_pin(path: str, name: str, title: str, upstream_config: str,
              config: str, entries: List[Entry]) -> None:
    header = [
        f'State-dict keys and shapes of {title},',
        'as upstream CO-DETR builds it: mmcv transformer bricks under',
        'query_head.transformer,',
        'cls/reg branches num_dec + 1, query_head.dn_generator.'
        'label_embedding,',
        'rpn_head, roi_head.0, bbox_head.0.',
        'Structure read from open-mmlab/mmdetection projects/CO-DETR:',
        f'{UPSTREAM_CODE},',
        f'{upstream_config}.',
        f'Built from: {osp.relpath(config, REPO_ROOT)}.',
        'Regenerate: python tests/test_projects/test_codetr/regen_keys.py '
        f'--only {name}',
        'Check against upstream code: add --upstream-root '
        '<mmdetection checkout> --check',
        "One 'key dim,dim,...' per line (empty shape: a scalar).",
    ]
    with open(path, 'w') as f:
        f.writelines(f'# {line}\n' for line in header)
        f.writelines(f"{key} {','.join(map(str, shape))}\n"
                     for key, shape in entries)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--only', choices=sorted(PINS))
    parser.add_argument('--check', action='store_true',
                        help='compare with the pinned lists, write nothing')
    parser.add_argument('--upstream-root',
                        help='an open-mmlab/mmdetection checkout whose '
                        'projects/CO-DETR/codetr builds the models')
    args = parser.parse_args()
    import_implementation(args.upstream_root)
    failed = False
    for name in ([args.only] if args.only else sorted(PINS)):
        config, path, title, upstream_config = PINS[name]
        entries = build_entries(config, on_meta=args.upstream_root is None)
        if args.check:
            same = entries == read_pin(path)
            failed |= not same
            print(f'{name}: {len(entries)} keys, '
                  f"{'matches' if same else 'DIFFERS FROM'} {path}")
        else:
            write_pin(path, name, title, upstream_config, config, entries)
            print(f'{name}: wrote {len(entries)} keys to {path}')
    return int(failed)


if __name__ == '__main__':
    sys.exit(main())
