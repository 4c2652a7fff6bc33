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

With ``--to-upstream`` it converts the other way: a checkpoint of ours
(MMEngine's, from training or from this tool) becomes a file in upstream's
layout, for upstream's ``train.py -r`` / ``-t`` and
``tools/deployment/export_onnx.py``; ``--config`` is required (the anchors
upstream caches are for its test size):

    python tools/convert_dfine_checkpoint.py --to-upstream \
        work_dirs/dfine_hgnetv2_n_coco/epoch_160.pth dfine_n_upstream.pth \
        --config projects/D-FINE/configs/dfine_hgnetv2_n_coco.py

``model`` holds the raw weights and, when the checkpoint has EMAHook's
``ema_state_dict``, ``ema`` holds the EMA weights (``module``, which
upstream evaluates and exports) and the update count (``updates``).
DEIM's D-FINE-based checkpoints convert here too.
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
from mmddp_ext.utils import converter_cli  # noqa: E402

# Under the names the configs' custom_imports give the packages (their
# directories have hyphens), so that their components register once.
rtdetr = import_module('projects.RT-DETR.rtdetr')
dfine = import_module('projects.D-FINE.dfine')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = converter_cli.converter_arg_parser(
        __doc__,
        src_help='upstream D-FINE / DEIM or HGNetv2 checkpoint (.pth); with '
        '--to-upstream, a checkpoint of ours',
        dst_help='output file',
        config_help='our model config; checks every shape, the sampling '
        'points and that no model key is missing (recommended)',
        eval_size_help="with --to-upstream: upstream's eval_spatial_size, "
        "for its anchors (default: the config's test Resize)")
    return converter_cli.parse_converter_args(parser, argv)


def from_upstream(args: argparse.Namespace, upstream, source):
    """A D-FINE checkpoint or an HGNetv2 file, for the port."""
    backbone = dfine.is_hgnetv2_checkpoint(upstream)
    kind = 'ImageNet HGNetv2 backbone' if backbone else 'D-FINE'
    print(f'converting {len(upstream)} tensors ({kind}) from {source}')
    model = (
        checkpoint_conversion.build_reference_model(args.config)
        if args.config else None)
    if backbone:
        return dfine.convert_hgnetv2_state_dict(
            upstream, model and model.backbone.state_dict())
    return dfine.convert_dfine_state_dict(
        upstream, model and model.state_dict(),
        model and dfine.decoder_num_points(model))


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.to_upstream:
        return converter_cli.run_to_upstream(
            args, dfine.dfine_upstream_converter(args.eval_size))
    return converter_cli.run_from_upstream(
        args, rtdetr.select_upstream_weights,
        lambda upstream, source: from_upstream(args, upstream, source))


if __name__ == '__main__':
    sys.exit(main())
