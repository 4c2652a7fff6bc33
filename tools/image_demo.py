"""Detect objects in images, draw the boxes and write the results.

MMDetection's ``demo/image_demo.py`` for this package's models (RT-DETR
v1/v2, D-FINE, DEIM, DEIMv2, CO-DINO) and any MMDetection 3.x config, on
mmdet's :class:`~mmdet.apis.DetInferencer` and with its output layout:
``OUT_DIR/vis/<image name>`` (the drawn image) and
``OUT_DIR/preds/<image stem>.json`` (``labels``, ``scores``, ``bboxes`` in
the input's pixels).

A checkpoint saved with an EMA hook is deployed with its EMA weights
(``--no-ema``: the trained ones), and the log says which were used. What
else differs from MMDetection's script, and why: docs/inference.md.

    python tools/image_demo.py demo.jpg CONFIG --weights CKPT
    python tools/image_demo.py IMAGE_DIR CONFIG --weights CKPT \\
        --out-dir outputs --pred-score-thr 0.5 --device cuda:0
"""
import argparse
import logging
import os
import os.path as osp
import sys
from typing import Dict, List, Optional, Tuple

TOOLS_DIR = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(TOOLS_DIR)
for path in (REPO_ROOT, TOOLS_DIR):
    # projects/ imports need the repository root; train.py's config helpers
    # are shared through the tools directory.
    if path not in sys.path:
        sys.path.insert(0, path)

from train import _DictAction, _fromfile, config_file  # noqa: E402

TOOL = 'image_demo.py'
IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif',
                    '.tiff', '.webp')  # DetInferencer's, for directories
DEFAULT_VISUALIZER = dict(
    type='DetLocalVisualizer',
    vis_backends=[dict(type='LocalVisBackend')],
    name='visualizer')


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description='Draw a detector\'s boxes on images (MMDetection\'s '
        'demo/image_demo.py)')
    parser.add_argument('inputs', help='an image file or a folder of images')
    parser.add_argument('model', metavar='CONFIG', help='model config file')
    parser.add_argument('--weights', help='checkpoint file')
    parser.add_argument(
        '--out-dir',
        default='outputs',
        help='output folder: drawn images in vis/, predictions in preds/')
    parser.add_argument(
        '--device',
        help='device for inference, e.g. cpu or cuda:0 (default: cuda:0 '
        'when a GPU is available, else cpu)')
    parser.add_argument(
        '--pred-score-thr',
        type=float,
        default=0.3,
        help='draw boxes scoring at least this (the JSON keeps them all)')
    parser.add_argument(
        '--batch-size', type=int, default=1, help='inference batch size')
    parser.add_argument(
        '--show', action='store_true', help='show each image in a window')
    parser.add_argument(
        '--no-save-vis',
        action='store_true',
        help='do not write the drawn images')
    parser.add_argument(
        '--no-save-pred',
        action='store_true',
        help='do not write the prediction JSON files')
    parser.add_argument(
        '--print-result', action='store_true', help='print the predictions')
    parser.add_argument(
        '--palette',
        default='none',
        choices=['coco', 'voc', 'citys', 'random', 'none'],
        help='box colours (none: the config\'s, else random)')
    parser.add_argument(
        '--no-ema',
        action='store_true',
        help='use the raw weights of a checkpoint saved with EMA, not the '
        'average (the default)')
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow the checkpoint to load with weights_only=False when the '
        'safe load refuses it (a legacy file you trust)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=_DictAction,
        help='override config keys, key=value (as in tools/train.py)')
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        parser.error(f'--batch-size must be at least 1, got '
                     f'{args.batch_size}')
    return args


def check_paths(args: argparse.Namespace) -> str:
    """The config file of ``args.model``, once it, ``--weights`` and the
    inputs are known to exist.

    Raises:
        SystemExit: A path is missing or wrong; the message names it and
            the fix.
    """
    if args.model.endswith(('.pth', '.pt')):
        raise SystemExit(
            f'{TOOL}: {args.model!r} is a checkpoint; give the config file '
            f'as CONFIG and the checkpoint with --weights: python '
            f'tools/{TOOL} INPUTS CONFIG --weights {args.model}')
    config = config_file(args.model, TOOL)
    if args.weights is not None and not osp.isfile(args.weights):
        raise SystemExit(
            f'{TOOL}: checkpoint file {args.weights!r} (--weights) does not '
            'exist (paths are relative to the current directory); leave '
            '--weights out only to try a randomly initialised model.')
    if '://' in args.inputs:
        return config  # a URL: mmengine's file backends fetch it
    if osp.isdir(args.inputs):
        if not any(name.lower().endswith(IMAGE_EXTENSIONS)
                   for name in sorted(os.listdir(args.inputs))):
            raise SystemExit(
                f'{TOOL}: the folder {args.inputs!r} has no image '
                f'({", ".join(IMAGE_EXTENSIONS)}); give an image file or a '
                'folder of images.')
    elif not osp.isfile(args.inputs):
        raise SystemExit(
            f'{TOOL}: input {args.inputs!r} does not exist (paths are '
            'relative to the current directory); give an image file or a '
            'folder of images.')
    return config


def load_config(path: str, cfg_options: Optional[dict] = None):
    """The config at ``path`` (its ``custom_imports`` imported) with
    ``cfg_options`` merged and mmdet's ``default_scope`` and
    ``visualizer`` where it has none."""
    cfg = _fromfile(path)
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    dataset = (cfg.get('test_dataloader') or {}).get('dataset') or {}
    if 'pipeline' not in dataset:
        raise SystemExit(
            f'{TOOL}: {path} has no test_dataloader.dataset.pipeline; the '
            'demo runs the test pipeline (LoadImageFromFile, Resize, ..., '
            'PackDetInputs). Add one, as MMDetection\'s base configs do.')
    cfg.setdefault('default_scope', 'mmdet')
    cfg.setdefault('visualizer', DEFAULT_VISUALIZER)
    return cfg


def select_weights(checkpoint: dict, use_ema: bool = True) -> Tuple[dict, str]:
    """The state dict to deploy from ``checkpoint`` and a line saying which
    weights it holds.

    MMEngine's ``EMAHook.before_save_checkpoint`` swaps the average into
    ``state_dict`` (the weights to deploy) and keeps the raw weights in
    ``ema_state_dict`` (``split_mmengine_checkpoint`` reads the layout).

    Args:
        checkpoint (dict): A loaded checkpoint, or a bare state dict.
        use_ema (bool): Take the average where the checkpoint has one,
            else the raw weights. Defaults to True.
    """
    from mmddp_ext.utils import split_mmengine_checkpoint
    raw, ema, steps = split_mmengine_checkpoint(checkpoint)
    if ema is None:
        source = checkpoint.get('meta', {}).get('source')
        origin = f' (converted from upstream\'s {source})' if source else ''
        return raw, (f'the checkpoint\'s state_dict{origin}; it has '
                     'no ema_state_dict, so there is no EMA choice')
    steps = f' after {steps} updates'
    if use_ema:
        return ema, (f'the EMA weights{steps} (state_dict, where '
                     'EMAHook saves the average; --no-ema for the raw '
                     'weights)')
    return raw, ('the raw weights (ema_state_dict without its module. '
                 f'prefix), not the EMA average{steps} (--no-ema)')


def check_weights_cover(model, state_dict: dict, weights: str) -> None:
    """Refuse a checkpoint that leaves model weights unset: the drawing
    would come from random weights. Extra checkpoint keys are allowed (and
    reported by MMEngine's loader).

    Raises:
        SystemExit: Names the count, the first missing keys and the fix.
    """
    names = {
        key[len('module.'):] if key.startswith('module.') else key
        for key in state_dict
    }
    missing = [key for key in model.state_dict() if key not in names]
    if missing:
        raise SystemExit(
            f'{TOOL}: {weights} has no value for {len(missing)} of the '
            f'model\'s {len(model.state_dict())} weights (first: '
            f'{", ".join(missing[:5])}); it was not trained with this '
            'config. Give the config it was trained with, or convert an '
            'upstream checkpoint first (tools/convert_*_checkpoint.py).')


def config_classes(cfg) -> tuple:
    """The class names of the config's test dataset (its ``metainfo``, else
    the dataset type's), without reading its annotations."""
    import copy

    from mmdet.registry import DATASETS
    dataset = copy.deepcopy(cfg.test_dataloader.dataset)
    dataset['lazy_init'] = True
    return tuple(DATASETS.build(dataset).metainfo['classes'])


def build_inferencer(cfg, weights: Optional[str], device: Optional[str],
                     palette: str, use_ema: bool, trust_checkpoint: bool):
    """mmdet's DetInferencer on ``cfg``, its checkpoint read with
    ``weights_only=True`` and its weights chosen by
    :func:`select_weights`."""
    from mmdet.apis import DetInferencer
    from mmengine.logging import print_log

    from mmddp_ext.utils import UnsafeCheckpointError, safe_checkpoint_loading

    class DemoInferencer(DetInferencer):
        """Differs from ``DetInferencer._load_weights_to_model`` by the
        weights loaded (:func:`select_weights`), the check that they cover
        the model, and class names from the config instead of COCO's when
        the checkpoint has none."""

        def _load_weights_to_model(self, model, checkpoint, cfg):
            if checkpoint is not None:
                state_dict, which = select_weights(checkpoint, use_ema)
                check_weights_cover(model, state_dict, weights)
                print_log(f'{TOOL}: using {which}', logger='current')
                meta = dict(checkpoint.get('meta') or {})
                if 'dataset_meta' not in meta and 'CLASSES' not in meta:
                    meta['dataset_meta'] = dict(classes=config_classes(cfg))
                checkpoint = dict(checkpoint, state_dict=state_dict, meta=meta)
            else:
                print_log(
                    f'{TOOL}: no --weights: the model is randomly '
                    'initialised',
                    logger='current',
                    level=logging.WARNING)
            super()._load_weights_to_model(model, checkpoint, cfg)
            if checkpoint is None:
                model.dataset_meta['classes'] = config_classes(cfg)

    trusted = [weights] if trust_checkpoint and weights else None
    try:
        with safe_checkpoint_loading(trusted):
            return DemoInferencer(
                model=cfg, weights=weights, device=device, palette=palette)
    except UnsafeCheckpointError as error:
        raise SystemExit(f'{TOOL}: {error} Here: --trust-checkpoint.') from (
            error)


def resolve_device(device: Optional[str]) -> str:
    """``device``, or what MMEngine picks (a GPU where one is available);
    a CUDA device without CUDA is refused with the fix."""
    import torch
    from mmengine.device import get_device
    if device is None:
        return get_device()
    if device.startswith('cuda') and not torch.cuda.is_available():
        raise SystemExit(f'{TOOL}: --device {device}, but torch sees no CUDA '
                         'device; use --device cpu.')
    return device


def main(argv=None) -> Dict[str, List]:
    """Run the demo; returns DetInferencer's results (``predictions``:
    one dict per image)."""
    args = parse_args(argv)
    config = check_paths(args)

    import mmddp_ext  # noqa: F401  (registers models and layers)

    cfg = load_config(config, args.cfg_options)
    inferencer = build_inferencer(cfg, args.weights,
                                  resolve_device(args.device), args.palette,
                                  not args.no_ema, args.trust_checkpoint)
    out_dir = '' if args.no_save_vis and args.no_save_pred else args.out_dir
    results = inferencer(
        args.inputs,
        batch_size=args.batch_size,
        show=args.show,
        no_save_vis=args.no_save_vis,
        no_save_pred=args.no_save_pred,
        print_result=args.print_result,
        pred_score_thr=args.pred_score_thr,
        out_dir=out_dir)
    if out_dir:
        from mmengine.logging import print_log
        print_log(
            f'{TOOL}: results have been saved at {out_dir} (vis/: drawn '
            'images, preds/: predictions as JSON)',
            logger='current')
    return results


if __name__ == '__main__':
    main()
