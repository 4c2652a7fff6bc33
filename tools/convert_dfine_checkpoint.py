r"""Convert official D-FINE (Peterande/D-FINE) and DEIM-D-FINE
(ShihuaHuang95/DEIM) weights for projects/D-FINE.

Two kinds of source file are recognised from their keys:

- a detector checkpoint (keys ``backbone.*``, ``encoder.*``,
  ``decoder.*``, under ``ema.module`` or ``model``); the output is a state
  dict of the ``DFINE`` model, for ``load_from``:

    python tools/convert_dfine_checkpoint.py dfine_n_coco.pth \
        checkpoints/dfine_n_coco_mmdet.pth \
        --config projects/D-FINE/configs/dfine_hgnetv2_n_custom.py

- an ImageNet HGNetv2 file (``PPHGNetV2_B0_stage1.pth`` ..., keys
  ``stem.*`` and ``stages.*``): its names are already the backbone's, so
  the configs load it as it is; converting it only checks it against a
  config's backbone.

Every mapped key is printed. The conversion fails (exit code 1) when a key
has no rule, when the checkpoint was saved after upstream's ``deploy()``
(fused convolutions, dropped layers), when two copies of ``up`` /
``reg_scale`` disagree, or, with ``--config``, when a shape differs from
the model's, the model has keys the checkpoint lacks, or the checkpoint's
sampling points per level (``num_points_scale``) differ from the config's
``num_points``.
"""
import argparse
import os.path as osp
import sys
from importlib import import_module
from typing import List, Optional

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # The conversion lives in projects/D-FINE, imported from the root.
    sys.path.insert(0, REPO_ROOT)

from mmddp_ext.utils import checkpoint_conversion  # noqa: E402

# Under the names the configs' custom_imports give the packages (their
# directories have hyphens), so that their components register once.
rtdetr = import_module('projects.RT-DETR.rtdetr')
dfine = import_module('projects.D-FINE.dfine')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'src', help='upstream D-FINE / DEIM or HGNetv2 checkpoint (.pth)')
    parser.add_argument('dst', help='output file')
    parser.add_argument(
        '--config',
        help='our model config; checks every shape, the sampling points '
        'and that no model key is missing (recommended)')
    parser.add_argument(
        '--trust-pickle',
        action='store_true',
        help='load the source with weights_only=False (only for files you '
        'trust, if the safe loader refuses it)')
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    try:
        checkpoint = checkpoint_conversion.load_upstream_checkpoint(
            args.src, args.trust_pickle)
        upstream, source = rtdetr.select_upstream_weights(checkpoint)
        backbone = dfine.is_hgnetv2_checkpoint(upstream)
        kind = 'ImageNet HGNetv2 backbone' if backbone else 'D-FINE'
        print(f'converting {len(upstream)} tensors ({kind}) from {source}')
        model = (
            checkpoint_conversion.build_reference_model(args.config)
            if args.config else None)
        if backbone:
            converted = dfine.convert_hgnetv2_state_dict(
                upstream, model and model.backbone.state_dict())
        else:
            converted = dfine.convert_dfine_state_dict(
                upstream, model and model.state_dict(),
                model and dfine.decoder_num_points(model))
    except checkpoint_conversion.CheckpointConversionError as error:
        print(error, file=sys.stderr)
        return 1
    checkpoint_conversion.save_converted_checkpoint(converted, args.dst,
                                                    args.src, source, print)
    return 0


if __name__ == '__main__':
    sys.exit(main())
