r"""Regenerate the pinned upstream key layouts in this folder, and check the
test layout generator (``../upstream_layout.py``) against upstream.

    git clone https://github.com/lyuwenyu/RT-DETR /tmp/upstream/RT-DETR
    git -C /tmp/upstream/RT-DETR checkout \
        068dfde65f2667ad6555883c69d73de886518cad
    python tests/test_projects/test_rtdetr/data/make_upstream_layouts.py \
        /tmp/upstream/RT-DETR [--write]

Builds upstream's own modules (PResNet, HybridEncoder, RTDETRTransformer /
RTDETRTransformerv2) from the checkout's source, with the hyper-parameters
of each official COCO config, and compares their state dict layouts with
``upstream_layout.zoo_layout`` and ``presnet_layout``. ``--write`` rewrites
``rtdetr_r18vd_v{1,2}_keys.json``. Needs torch only: the checkout's
``src.core`` registry and torchvision's ``box_area`` are stubbed, since
only module construction runs.
"""
import argparse
import importlib
import importlib.util
import json
import os.path as osp
import sys
import types

HERE = osp.dirname(osp.abspath(__file__))
sys.path.insert(0, osp.dirname(HERE))
import upstream_layout  # noqa: E402

PACKAGES = ['src', 'src.nn', 'src.nn.backbone', 'src.zoo', 'src.zoo.rtdetr']


def _register(*args, **kwargs):
    """Stand-in for upstream's ``@register`` / ``@register()``."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda cls: cls


def load_upstream(root: str):
    """Import one upstream tree (``rtdetr_pytorch`` or
    ``rtdetrv2_pytorch``) as package ``src`` without its ``__init__``
    files, which pull in the data and training stack."""
    for name in [m for m in sys.modules if m == 'src' or m.startswith('src.')]:
        del sys.modules[name]
    for name in PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = [osp.join(root, *name.split('.'))]
        sys.modules[name] = package
    core = types.ModuleType('src.core')
    core.register = _register
    sys.modules['src.core'] = core
    if ('torchvision' not in sys.modules
            and importlib.util.find_spec('torchvision') is None):
        for name in ('torchvision', 'torchvision.ops',
                     'torchvision.ops.boxes'):
            sys.modules[name] = types.ModuleType(name)
        sys.modules['torchvision.ops.boxes'].box_area = None
    return types.SimpleNamespace(
        presnet=importlib.import_module('src.nn.backbone.presnet'),
        encoder=importlib.import_module('src.zoo.rtdetr.hybrid_encoder'),
        decoder=importlib.import_module(
            'src.zoo.rtdetr.rtdetrv2_decoder' if osp.basename(root) ==
            'rtdetrv2_pytorch' else 'src.zoo.rtdetr.rtdetr_decoder'))


def layout_of(module, prefix: str = '') -> dict:
    return {
        prefix + key: list(value.shape)
        for key, value in module.state_dict().items()
    }


def upstream_model_layout(src, version: int, depth: int, num_layers: int,
                          expansion: float = 1.0, hidden_dim: int = 256,
                          encoder_ffn: int = 1024) -> dict:
    """State dict layout of upstream's model for one zoo config."""
    small = depth < 50
    backbone = src.presnet.PResNet(
        depth,
        variant='d',
        return_idx=[1, 2, 3],
        freeze_at=-1 if small else 0,
        freeze_norm=not small,
        pretrained=False)
    encoder = src.encoder.HybridEncoder(
        in_channels=[128, 256, 512] if small else [512, 1024, 2048],
        hidden_dim=hidden_dim,
        dim_feedforward=encoder_ffn,
        expansion=expansion,
        eval_spatial_size=[640, 640])
    common = dict(
        num_classes=80,
        feat_channels=[hidden_dim] * 3,
        feat_strides=[8, 16, 32],
        hidden_dim=256,
        num_levels=3,
        num_queries=300,
        num_denoising=100,
        eval_spatial_size=[640, 640])
    if version == 1:
        decoder = src.decoder.RTDETRTransformer(
            num_decoder_layers=num_layers, **common)
    else:
        decoder = src.decoder.RTDETRTransformerv2(
            num_layers=num_layers, num_points=[4, 4, 4], **common)
    layout = layout_of(backbone, 'backbone.')
    layout.update(layout_of(encoder, 'encoder.'))
    layout.update(layout_of(decoder, 'decoder.'))
    return layout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkout', help='a lyuwenyu/RT-DETR checkout')
    parser.add_argument(
        '--write',
        action='store_true',
        help='rewrite the pinned rtdetr_r18vd_v{1,2}_keys.json')
    args = parser.parse_args()
    failures = 0
    for version, tree in ((1, 'rtdetr_pytorch'), (2, 'rtdetrv2_pytorch')):
        src = load_upstream(osp.join(args.checkout, tree))
        for depth in upstream_layout.BLOCKS:
            for frozen in (False, True):
                theirs = layout_of(
                    src.presnet.PResNet(
                        depth, freeze_norm=frozen, pretrained=False))
                ours = upstream_layout.presnet_layout(depth, frozen)
                failures += _report(f'v{version} PResNet-{depth} '
                                    f'freeze_norm={frozen}', theirs, ours)
        for (zoo_version, name), arch in upstream_layout.ZOO.items():
            if zoo_version != version:
                continue
            theirs = upstream_model_layout(src, version, **arch)
            failures += _report(f'v{version} {name}', theirs,
                                upstream_layout.zoo_layout(version, name))
            if name == 'r18vd' and args.write:
                path = osp.join(HERE, f'rtdetr_r18vd_v{version}_keys.json')
                with open(path, 'w') as f:
                    json.dump(theirs, f, indent=0)
                    f.write('\n')
                print(f'wrote {path}')
    return 1 if failures else 0


def _report(what: str, theirs: dict, ours: dict) -> int:
    if theirs == ours:
        print(f'ok    {what}: {len(theirs)} keys')
        return 0
    diff = sorted(set(theirs) ^ set(ours))[:5] + [
        k for k in theirs if k in ours and theirs[k] != ours[k]
    ][:5]
    print(f'FAIL  {what}: {diff}')
    return 1


if __name__ == '__main__':
    sys.exit(main())
