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

With ``--to-upstream`` it converts the other way: a checkpoint of ours
(MMEngine's, from training or from this tool) becomes a file in upstream's
layout, for upstream's ``train.py -r`` / ``-t`` and
``tools/export_onnx.py``; ``--config`` is required (v1 or v2 names from
its ``param_name_map``, v2's anchors for its test size):

    python tools/convert_rtdetr_checkpoint.py --to-upstream \
        work_dirs/rtdetrv2_r18vd_120e_coco/epoch_120.pth \
        rtdetrv2_r18vd_upstream.pth \
        --config projects/RT-DETR/configs/rtdetrv2_r18vd_120e_coco.py

``model`` holds the raw weights and, when the checkpoint has EMAHook's
``ema_state_dict``, ``ema`` holds the EMA weights (``module``, which
upstream evaluates and exports) and the update count (``updates``; v1
also ``warmups``). DEIM's RT-DETRv2 checkpoints convert here too.
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

from mmengine.config import Config  # noqa: E402

from mmddp_ext.utils import checkpoint_conversion  # noqa: E402
from mmddp_ext.utils import converter_cli  # noqa: E402

# upstream v1 ModelEMA's default, for configs without an EMA hook
V1_EMA_WARMUPS = 2000

# Under the name the configs' custom_imports give the package (its
# directory has a hyphen), so that its components register once.
rtdetr = import_module('projects.RT-DETR.rtdetr')


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = converter_cli.converter_arg_parser(
        __doc__,
        src_help='upstream RT-DETR or PResNet-vd checkpoint (.pth); with '
        '--to-upstream, a checkpoint of ours',
        dst_help='output file: for load_from, or for a PResNet file the '
        "backbone's init_cfg checkpoint; with --to-upstream, upstream's",
        config_help='our model config; checks every shape and that no model '
        '(or backbone) key is missing (recommended)',
        eval_size_help="with --to-upstream: upstream's eval_spatial_size, "
        "for v2's anchors (default: the config's test Resize)")
    parser.add_argument(
        '--upstream-version',
        type=int,
        choices=[1, 2],
        help='with --to-upstream: 1 for rtdetr_pytorch, 2 for '
        "rtdetrv2_pytorch names (default: the config's param_name_map)")
    return converter_cli.parse_converter_args(parser, argv)


def upstream_version(cfg: Config, override: Optional[int]) -> int:
    """v1 or v2 names: ``--upstream-version``, else the config's
    ``param_name_map`` (the names its optimizer groups match)."""
    name_map = cfg.get('optim_wrapper', {}).get('paramwise_cfg',
                                                {}).get('param_name_map', {})
    version = override or name_map.get('version')
    if version not in (1, 2):
        raise checkpoint_conversion.CheckpointConversionError(
            'The config names no upstream version (optim_wrapper.'
            'paramwise_cfg.param_name_map.version): pass --upstream-version '
            '1 (rtdetr_pytorch) or 2 (rtdetrv2_pytorch).')
    return version


def ema_warmups(cfg: Config) -> int:
    """Upstream v1 saves its ModelEMA's ``warmups``: the config's EMA hook's
    (``gamma`` of ExpMomentumEMA, ``warmups`` of ModelEMA)."""
    for hook in cfg.get('custom_hooks', []):
        if 'EMA' in str(hook.get('type', '')):
            return int(hook.get('warmups', hook.get('gamma', V1_EMA_WARMUPS)))
    return V1_EMA_WARMUPS


def to_upstream_converter(args: argparse.Namespace):
    """``--to-upstream``'s inverse (v1 or v2 names), bound to the config's
    model."""

    def converter(cfg: Config, model):
        version = upstream_version(cfg, args.upstream_version)
        eval_size = (
            checkpoint_conversion.upstream_eval_size(cfg, args.eval_size)
            if version == 2 else None)
        return ((lambda state, log: rtdetr.convert_rtdetr_to_upstream(
            state, model, version, eval_size, log)),
                dict(warmups=ema_warmups(cfg)) if version == 1 else None)

    return converter


def from_upstream(args: argparse.Namespace, upstream, source):
    """An RT-DETR checkpoint or a PResNet-vd file, for the port."""
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
    return convert(upstream, reference)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.to_upstream:
        return converter_cli.run_to_upstream(args,
                                             to_upstream_converter(args))
    return converter_cli.run_from_upstream(
        args, rtdetr.select_upstream_weights,
        lambda upstream, source: from_upstream(args, upstream, source))


if __name__ == '__main__':
    sys.exit(main())
