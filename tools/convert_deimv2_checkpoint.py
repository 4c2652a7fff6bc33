r"""Convert official DEIMv2 (Intellindust-AI-Lab/DEIMv2) weights for
projects/DEIMv2.

Three kinds of source file are recognised from their keys:

- a detector checkpoint (keys ``backbone.*``, ``encoder.*``,
  ``decoder.*``, under ``ema.module`` or ``model``); the output is a state
  dict of the ``DEIMv2`` model, for ``load_from``:

    python tools/convert_deimv2_checkpoint.py deimv2_dinov3_s_coco.pth \
        checkpoints/deimv2_dinov3_s_coco_mmdet.pth \
        --config projects/DEIMv2/configs/deimv2_dinov3_s_coco.py

  DEIMv2's decoder keeps D-FINE's module names (``decoder.decoder.layers``,
  ``dec_bbox_head``, ...), so the mapping is
  ``tools/convert_dfine_checkpoint.py``'s, key for key; where a config
  shares the box branch (Atto, Femto, Pico: ``share_bbox_head``) upstream
  saves the one branch under every layer index, and those copies must be
  equal;
- a ViT file DEIMv2 starts from (``vitt_distill.pt``,
  ``vittplus_distill.pt``, DINOv3's ``dinov3_vits16*_pretrain_*.pth``:
  keys ``blocks.*``, ``patch_embed.*``, ``cls_token``): its names are the
  ViT's (``DINOv3STAs.vit``), so the configs load it as it is
  (``backbone.vit_init_cfg``); converting it checks it against a config's
  ViT;
- an ImageNet HGNetv2 file (``PPHGNetV2_B0_stage1.pth`` ...: keys
  ``stem.*``, ``stages.*``): names unchanged. For Atto, Femto and Pico,
  which upstream starts from B0's file, only the keys whose shapes match
  the config's backbone are kept, as upstream loads it; each dropped key
  is printed.

Every mapped key is printed. The conversion fails (exit code 1) on the
conditions ``tools/convert_dfine_checkpoint.py`` lists, on unequal copies
of a shared branch, and, with ``--config``, on ViT keys or shapes that
differ from the config's ViT.

With ``--to-upstream`` it converts the other way: a checkpoint of ours
(MMEngine's, from training or from this tool) becomes a file in upstream's
layout, for upstream's ``train.py -r`` / ``-t`` and
``tools/deployment/export_onnx.py``; ``--config`` is required (the anchors
upstream caches are for its test size):

    python tools/convert_deimv2_checkpoint.py --to-upstream \
        work_dirs/deimv2_hgnetv2_atto_coco/epoch_500.pth \
        deimv2_atto_upstream.pth \
        --config projects/DEIMv2/configs/deimv2_hgnetv2_atto_coco.py

``model`` holds the raw weights and, when the checkpoint has EMAHook's
``ema_state_dict``, ``ema`` holds the EMA weights (``module``, which
upstream evaluates and exports) and the update count (``updates``).
"""
import argparse
import os.path as osp
import sys
from importlib import import_module
from typing import List, Optional

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # The conversion lives in projects/DEIMv2, imported from the root.
    sys.path.insert(0, REPO_ROOT)

from mmddp_ext.utils import checkpoint_conversion  # noqa: E402
from mmddp_ext.utils import converter_cli  # noqa: E402

# Under the names the configs' custom_imports give the packages (their
# directories have hyphens), so that their components register once.
rtdetr = import_module('projects.RT-DETR.rtdetr')
dfine = import_module('projects.D-FINE.dfine')
deimv2 = import_module('projects.DEIMv2.deimv2')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = converter_cli.converter_arg_parser(
        __doc__,
        src_help='upstream DEIMv2 checkpoint, ViT or HGNetv2 file; with '
        '--to-upstream, a checkpoint of ours',
        dst_help='output file',
        config_help='our model config; checks every shape, the sampling '
        'points, the shared branches and that no model key is missing '
        '(recommended)',
        eval_size_help="with --to-upstream: upstream's eval_spatial_size, "
        "for its anchors (default: the config's test Resize)")
    return converter_cli.parse_converter_args(parser, argv)


def from_upstream(args: argparse.Namespace, upstream, source):
    """A DEIMv2 checkpoint, a ViT or an HGNetv2 file, for the port."""
    model = (
        checkpoint_conversion.build_reference_model(args.config)
        if args.config else None)
    if deimv2.is_vit_checkpoint(upstream):
        print(f'converting {len(upstream)} tensors (ViT) from {source}')
        return deimv2.convert_deimv2_vit_state_dict(
            upstream, model and model.backbone.vit.state_dict())
    if dfine.is_hgnetv2_checkpoint(upstream):
        print(f'converting {len(upstream)} tensors (HGNetv2) from {source}')
        return deimv2.convert_deimv2_hgnetv2_state_dict(
            upstream, model and model.backbone.state_dict())
    print(f'converting {len(upstream)} tensors (DEIMv2) from {source}')
    return deimv2.convert_deimv2_state_dict(upstream, model)


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
