r"""Regenerate the upstream key/shape manifests in this folder.

    git clone https://github.com/Intellindust-AI-Lab/DEIMv2 /tmp/DEIMv2
    git -C /tmp/DEIMv2 checkout 0fff8d4dcdc272e6cf2d84be31399db471357941
    python tests/test_projects/test_deimv2/data/make_upstream_manifests.py \
        /tmp/DEIMv2

For each of the 12 COCO configs (``configs/deimv2/deimv2_{size}_coco.yml``,
80 classes) it builds upstream's own ``DEIM`` model through upstream's
``YAMLConfig`` machinery (``load_config`` + ``create``), with
``HGNetv2.pretrained: False`` and ``DINOv3STAs.weights_path: None`` so that
nothing is downloaded or loaded (neither changes a key), and writes its
state dict's key -> shape map to ``deimv2_{size}_coco_keys.json``. For the
four DINOv3 sizes it also writes the key -> shape map of the ViT module
upstream loads its backbone-only file into (``weights_path``: the
``dinov3`` module for ViT-S / S+, ``dinov3._model`` for the distilled
ViT-Tiny / Tiny+) to ``deimv2_{size}_vit_keys.json``. Each size is built in
a fresh process: upstream's ``load_config`` keeps merged includes in a
default argument. Needs torch, PyYAML, scipy and this repository's
``mmddp_ext`` (``tools/setup_env.sh`` installs it); see
``mmddp_ext/testing/upstream_checkout.py`` for the stubbed imports.
"""
import argparse
import json
import os.path as osp
import subprocess
import sys

HERE = osp.dirname(osp.abspath(__file__))
SIZES = ('hgnetv2_atto', 'hgnetv2_femto', 'hgnetv2_pico', 'hgnetv2_n',
         'hgnetv2_s', 'hgnetv2_m', 'hgnetv2_l', 'hgnetv2_x', 'dinov3_s',
         'dinov3_m', 'dinov3_l', 'dinov3_x')


def manifest_path(size: str, part: str = 'coco') -> str:
    return osp.join(HERE, f'deimv2_{size}_{part}_keys.json')


def layout(module) -> dict:
    return {
        key: list(value.shape)
        for key, value in module.state_dict().items()
    }


def build_manifests(checkout: str, size: str) -> dict:
    """``{'coco': detector layout, 'vit': ViT layout (DINOv3 sizes)}``
    of upstream's model for one size (run in a fresh process)."""
    sys.path.insert(0, osp.dirname(HERE))
    import upstream_deimv2
    upstream = upstream_deimv2.load_upstream(checkout)
    built = upstream_deimv2.build_from_yaml(
        upstream,
        osp.join(checkout, 'configs', 'deimv2', f'deimv2_{size}_coco.yml'),
        overrides={
            'HGNetv2': {
                'pretrained': False
            },
            'DINOv3STAs': {
                'weights_path': None
            }
        })
    model = built['model']
    manifests = {'coco': layout(model)}
    if size.startswith('dinov3'):
        vit = model.backbone.dinov3
        manifests['vit'] = layout(getattr(vit, '_model', vit))
    return manifests


def write_manifest(keys: dict, path: str) -> None:
    """One ``"key": [shape]`` per line, in state-dict order."""
    lines = [
        f'{json.dumps(key)}: {json.dumps(shape)}'
        for key, shape in keys.items()
    ]
    with open(path, 'w') as f:
        f.write('{\n' + ',\n'.join(lines) + '\n}\n')


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'checkout', help='an Intellindust-AI-Lab/DEIMv2 '
        'checkout')
    parser.add_argument('--one', choices=SIZES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkout = osp.abspath(args.checkout)
    if args.one:
        for part, keys in build_manifests(checkout, args.one).items():
            write_manifest(keys, manifest_path(args.one, part))
        return 0
    for size in SIZES:
        subprocess.run([sys.executable, __file__, checkout, '--one', size],
                       check=True)
        with open(manifest_path(size)) as f:
            print(f'wrote {manifest_path(size)}: {len(json.load(f))} keys')
    return 0


if __name__ == '__main__':
    sys.exit(main())
