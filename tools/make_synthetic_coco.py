"""Write a small synthetic COCO-format dataset (train/ and val/ splits).

    python tools/make_synthetic_coco.py data/synthetic --train 64 --val 16 \
        --empty 0.5
"""
import argparse
import os.path as osp
import sys

sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmddp_ext.testing.synthetic_coco import make_synthetic_coco  # noqa


def parse_empty(value: str):
    try:
        return float(value)
    except ValueError:
        return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('out_dir', help='dataset root, e.g. data/synthetic')
    parser.add_argument('--train', type=int, default=64,
                        help='number of training images')
    parser.add_argument('--val', type=int, default=16,
                        help='number of validation images')
    parser.add_argument('--classes', nargs='+', default=['square', 'disc'])
    parser.add_argument('--size', type=int, default=96, help='image side')
    parser.add_argument(
        '--empty', type=parse_empty, default=0.5,
        help="which training images have no boxes: a fraction, 'none', "
        "'all', 'odd' or 'modN:R'")
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args(argv)
    for split, count, empty, seed in (('train', args.train, args.empty,
                                       args.seed),
                                      ('val', args.val, 0.25, args.seed + 1)):
        info = make_synthetic_coco(
            osp.join(args.out_dir, split), num_images=count,
            classes=args.classes, image_size=args.size, empty=empty,
            seed=seed)
        print(f'wrote {count} {split} images to {info["data_root"]}')


if __name__ == '__main__':
    main()
