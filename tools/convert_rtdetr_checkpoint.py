r"""Convert official RT-DETR weights (lyuwenyu/RT-DETR) for projects/RT-DETR.

Two kinds of source file are recognised from their keys:

- a detector checkpoint of rtdetr_pytorch (v1) or rtdetrv2_pytorch (v2),
  keys ``backbone.*``, ``encoder.*``, ``decoder.*``; the output is a state
  dict of the ``RTDETR`` model, for ``load_from``:

    python tools/convert_rtdetr_checkpoint.py rtdetr_r18vd_dec3_6x_coco.pth \
        checkpoints/rtdetr_r18vd_mmdet.pth \
        --config projects/RT-DETR/configs/rtdetr_r18vd_6x_coco.py

- an ImageNet PResNet-vd backbone (``ResNet18_vd_pretrained_from_paddle.pth``
  and the r34/r50/r101 files that upstream's presnet.py downloads), keys
  ``conv1.*`` and ``res_layers.*``; the output is a state dict of
  ``ResNetVdRTDETR``, for the backbone's ``init_cfg``:

    python tools/convert_rtdetr_checkpoint.py \
        ResNet50_vd_ssld_v2_pretrained_from_paddle.pth \
        checkpoints/presnet50vd_ssld_v2_mmdet.pth \
        --config projects/RT-DETR/configs/rtdetr_r50vd_6x_coco.py

Every mapped key is printed. The conversion fails (exit code 1) when a key
has no rule, when the checkpoint uses v2 features the port does not
implement (discrete sampling, per-level point counts), or, with
``--config``, when a converted tensor's shape differs from the model's or
the model has keys the checkpoint lacks. A checkpoint saved after
upstream's ``deploy()`` converts from its training-form RepVGG weights.
"""
import argparse
import os.path as osp
import sys
from importlib import import_module
from typing import List, Optional

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # The conversion lives in projects/RT-DETR, imported from the root.
    sys.path.insert(0, REPO_ROOT)

from mmddp_ext.utils import checkpoint_conversion  # noqa: E402

# Under the name the configs' custom_imports give the package (its
# directory has a hyphen), so that its components register once.
rtdetr = import_module('projects.RT-DETR.rtdetr')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'src', help='upstream RT-DETR or PResNet-vd checkpoint (.pth)')
    parser.add_argument(
        'dst',
        help='output file: for load_from, or for a PResNet file the '
        "backbone's init_cfg checkpoint")
    parser.add_argument(
        '--config',
        help='our model config; checks every shape and that no model (or '
        'backbone) key is missing (recommended)')
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
        rtdetr.refuse_discrete_sampling(args.src)
        backbone = rtdetr.is_presnet_checkpoint(upstream)
        kind = 'ImageNet PResNet backbone' if backbone else 'RT-DETR'
        print(f'converting {len(upstream)} tensors ({kind}) from {source}')
        reference = (
            checkpoint_conversion.build_reference_model(
                args.config, backbone).state_dict() if args.config else None)
        convert = (
            rtdetr.convert_presnet_state_dict
            if backbone else rtdetr.convert_rtdetr_state_dict)
        converted = convert(upstream, reference)
    except checkpoint_conversion.CheckpointConversionError as error:
        print(error, file=sys.stderr)
        return 1
    checkpoint_conversion.save_converted_checkpoint(converted, args.dst,
                                                    args.src, source, print)
    return 0


if __name__ == '__main__':
    sys.exit(main())
