"""Export a real-time DETR (RT-DETR v1/v2, D-FINE, DEIM, DEIMv2) to ONNX
with upstream's contract (``tools/deployment/export_onnx.py`` of their
repositories): inputs ``images`` (N, 3, H, W) float32 RGB in [0, 1]
(DEIMv2's DINOv3 configs: then normalised with ImageNet's mean and std,
as upstream) and ``orig_target_sizes`` (N, 2) int64 ``[w, h]``; outputs
``labels`` (N, K) int64, ``boxes`` (N, K, 4) float32 (x1, y1, x2, y2) in
original pixels, ``scores`` (N, K) float32. Details: docs/deploy.md.

    python tools/export_onnx.py CONFIG CHECKPOINT [--output F] [--opset 17]
        [--simplify] [--no-dynamic-batch] [--size H W] [--no-ema]
        [--no-verify] [--device cpu] [--trust-checkpoint]
        [--cfg-options ...]

The checkpoint's EMA weights are used when it has them (MMEngine's
EMAHook writes them to its ``state_dict``; ``--no-ema`` takes the trained
ones, as tools/image_demo.py); K is the config's
``model.test_cfg.max_per_img``; H x W the test pipeline's Resize scale
unless ``--size`` is given. Each is logged. Afterwards ONNX Runtime, if
installed, runs the file on one random image next to PyTorch and the
differences are logged (``--no-verify`` skips it).
"""
import argparse
import os.path as osp
import sys

TOOLS_DIR = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(TOOLS_DIR)
for path in (REPO_ROOT, TOOLS_DIR):
    # projects/ imports need the repository root; train.py's config
    # helpers are shared through the tools directory.
    if path not in sys.path:
        sys.path.insert(0, path)

from train import config_file  # noqa: E402


def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Export a real-time DETR to ONNX (upstream contract)')
    parser.add_argument('config', help='config file (or mmdet::...)')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--output',
        help='.onnx file to write (default: the checkpoint path with .onnx)')
    parser.add_argument(
        '--opset', type=int, default=17, help='ONNX opset (>= 16)')
    parser.add_argument(
        '--simplify',
        action='store_true',
        help='simplify the graph with onnxsim (pip install onnxsim)')
    parser.add_argument(
        '--dynamic-batch',
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a dynamic batch axis 'N' (default); --no-dynamic-batch fixes "
        'it to 1')
    parser.add_argument(
        '--size',
        type=int,
        nargs=2,
        metavar=('H', 'W'),
        help="input height and width (default: the test pipeline's Resize "
        'scale)')
    parser.add_argument(
        '--device', default='cpu', help='device to export on (cpu)')
    parser.add_argument(
        '--verify',
        action=argparse.BooleanOptionalAction,
        default=True,
        help='run the file in ONNX Runtime next to PyTorch and log the '
        'differences (default, when onnxruntime is installed)')
    parser.add_argument(
        '--no-ema',
        action='store_true',
        help='export the trained weights of a checkpoint with EMA (its '
        'ema_state_dict) instead of the EMA ones')
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow CHECKPOINT to load with weights_only=False when the '
        'safe load refuses it (a legacy file you trust)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config settings, key=value (e.g. '
        'model.test_cfg.max_per_img=100)')
    return parser.parse_args(argv)


def main(argv=None) -> str:
    """Export; return the path of the ``.onnx`` file."""
    args = parse_args(argv)
    from importlib.util import find_spec

    from mmengine.config import Config
    from mmengine.logging import print_log

    from mmddp_ext.deploy import (build_deploy_model, default_onnx_path,
                                  export_onnx, onnxruntime_differences)
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'export_onnx.py: checkpoint file '
                         f'{args.checkpoint!r} does not exist.')
    cfg = Config.fromfile(config_file(args.config, 'export_onnx.py'))
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    model, info = build_deploy_model(
        cfg,
        args.checkpoint,
        size=args.size,
        device=args.device,
        trusted_checkpoints=[args.checkpoint]
        if args.trust_checkpoint else None,
        ema=not args.no_ema)
    output = args.output or default_onnx_path(args.checkpoint)
    export_onnx(
        model,
        info,
        output,
        opset=args.opset,
        dynamic_batch=args.dynamic_batch,
        simplify=args.simplify)
    if args.verify and find_spec('onnxruntime') is not None:
        found = onnxruntime_differences(model, output, info)
        agree = found['unpaired'] == 0
        print_log(
            'ONNX Runtime vs PyTorch on one random image: '
            f"{'every' if agree else 'NOT every'} detection paired (same "
            f"label, score within 1e-5; {found['unpaired']} unpaired), max "
            f"|score diff| {found['max_score_diff']:.2e}, max |box diff| "
            f"{found['max_box_diff']:.2e} px, labels "
            f"{'in the same order' if found['in_order'] else 'reordered'}",
            logger='current',
            level=20 if agree else 30)
    return output


if __name__ == '__main__':
    main()
