r"""Regenerate the upstream key/shape manifests in this folder.

    git clone https://github.com/Peterande/D-FINE /tmp/upstream/D-FINE
    git -C /tmp/upstream/D-FINE checkout \
        4a1f73a8bcfac736a88abde9596d87f116d780a7
    python tests/test_projects/test_dfine/data/make_upstream_manifests.py \
        /tmp/upstream/D-FINE

For each zoo size (N, S, M, L, X) it builds upstream's own ``DFINE``
model from upstream's YAML (``configs/dfine/dfine_hgnetv2_{size}_coco.yml``,
80 classes, with ``HGNetv2.pretrained: False`` so nothing is downloaded)
through upstream's ``YAMLConfig`` machinery (``load_config`` +
``create``), and writes its state dict's key -> shape map to
``dfine_hgnetv2_{size}_coco_keys.json``. Each size is built in a fresh
process: upstream's ``load_config`` keeps merged includes in a default
argument, so a second config in one process would inherit the first's
keys. Needs torch, PyYAML and this repository's ``mmddp_ext``
(``tools/setup_env.sh`` installs it): see
``mmddp_ext/testing/upstream_checkout.py`` for the imports that model
construction does not need and that are stubbed (torchvision is not
installed beside this repository's torch).
"""
import argparse
import json
import os.path as osp
import subprocess
import sys

HERE = osp.dirname(osp.abspath(__file__))
SIZES = ('n', 's', 'm', 'l', 'x')


def manifest_path(size: str) -> str:
    return osp.join(HERE, f'dfine_hgnetv2_{size}_coco_keys.json')


def build_manifest(checkout: str, size: str) -> dict:
    """Key -> shape of upstream's model for one size (run in a fresh
    process)."""
    sys.path.insert(0, osp.dirname(HERE))
    import upstream_dfine
    upstream = upstream_dfine.load_upstream(checkout)
    built = upstream_dfine.build_from_yaml(
        upstream,
        osp.join(checkout, 'configs', 'dfine',
                 f'dfine_hgnetv2_{size}_coco.yml'),
        overrides={'HGNetv2': {
            'pretrained': False
        }})
    return {
        key: list(value.shape)
        for key, value in built['model'].state_dict().items()
    }


def write_manifest(layout: dict, path: str) -> None:
    """One ``"key": [shape]`` per line, in state-dict order."""
    lines = [
        f'{json.dumps(key)}: {json.dumps(shape)}'
        for key, shape in layout.items()
    ]
    with open(path, 'w') as f:
        f.write('{\n' + ',\n'.join(lines) + '\n}\n')


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkout', help='a Peterande/D-FINE checkout')
    parser.add_argument('--one', choices=SIZES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    checkout = osp.abspath(args.checkout)
    if args.one:
        write_manifest(
            build_manifest(checkout, args.one), manifest_path(args.one))
        return 0
    for size in SIZES:
        subprocess.run([sys.executable, __file__, checkout, '--one', size],
                       check=True)
        with open(manifest_path(size)) as f:
            print(f'wrote {manifest_path(size)}: {len(json.load(f))} keys')
    return 0


if __name__ == '__main__':
    sys.exit(main())
