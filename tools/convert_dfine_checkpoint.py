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
import importlib.util
import os.path as osp
import re
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch


def _sibling(name: str):
    """Import a script of this folder by file (tools/ is no package)."""
    path = osp.join(osp.dirname(osp.abspath(__file__)), f'{name}.py')
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The RT-DETR converter's checkpoint handling, shared.
_rtdetr = _sibling('convert_rtdetr_checkpoint')
ConversionError = _rtdetr.ConversionError
load_checkpoint = _rtdetr.load_checkpoint
save_converted = _rtdetr.save_converted
select_state_dict = _rtdetr.select_state_dict
_add_num_batches_tracked = _rtdetr._add_num_batches_tracked
_check_against = _rtdetr._check_against
_strip_module = _rtdetr._strip_module

# Keys upstream stores that the model derives itself: the anchors of the
# eval size, and the copies of up / reg_scale that upstream's inner decoder
# holds (checked equal to the outer ones).
DERIVED = re.compile(r'^decoder\.(anchors|valid_mask)$')
NUM_POINTS_SCALE = re.compile(
    r'^decoder\.decoder\.layers\.(\d+)\.cross_attn\.num_points_scale$')
FDR_COPY = re.compile(r'^decoder\.decoder\.(up|reg_scale)$')
# What upstream's convert_to_deploy() leaves: fused conv + BN, fused
# RepVGG blocks.
DEPLOY = re.compile(r'(conv_bn_fused\.|\.bottlenecks\.\d+\.conv\.)')
DETECTOR_PREFIXES = ('backbone.', 'encoder.', 'decoder.')
BACKBONE_KEY = re.compile(r'(stem|stages)\.')


def _rules(num_layers: int) -> List[Tuple[re.Pattern, Callable]]:
    """(pattern, target builder) pairs; the first full match wins."""
    table = [
        (r'backbone\.(.+)', lambda m: f'backbone.{m[1]}'),
        (r'encoder\.(.+)', lambda m: f'neck.{m[1]}'),
        (r'decoder\.(up|reg_scale)', lambda m: f'decoder.{m[1]}'),
        (r'decoder\.input_proj\.(\d+)\.(conv|norm)\.(.+)',
         lambda m: f'input_proj.{m[1]}.{m[2]}.{m[3]}'),
        (r'decoder\.decoder\.(layers|lqe_layers)\.(.+)',
         lambda m: f'decoder.{m[1]}.{m[2]}'),
        (r'decoder\.denoising_class_embed\.weight',
         lambda m: 'dn_query_generator.label_embedding.weight'),
        (r'decoder\.(query_pos_head|enc_output)\.(.+)',
         lambda m: f'{m[1]}.{m[2]}'),
        (r'decoder\.enc_score_head\.(weight|bias)',
         lambda m: f'bbox_head.cls_branches.{num_layers}.{m[1]}'),
        (r'decoder\.enc_bbox_head\.(.+)',
         lambda m: f'bbox_head.reg_branches.{num_layers}.{m[1]}'),
        (r'decoder\.dec_score_head\.(\d+)\.(weight|bias)',
         lambda m: f'bbox_head.cls_branches.{m[1]}.{m[2]}'),
        (r'decoder\.dec_bbox_head\.(\d+)\.(.+)',
         lambda m: f'bbox_head.reg_branches.{m[1]}.{m[2]}'),
        (r'decoder\.pre_bbox_head\.(.+)',
         lambda m: f'bbox_head.pre_bbox_head.{m[1]}'),
    ]
    return [(re.compile(pattern + '$'), build) for pattern, build in table]


def points_per_level(scale: torch.Tensor) -> List[int]:
    """Sampling points per level from upstream's ``num_points_scale``
    (``1 / n`` repeated ``n`` times per level)."""
    counts, values = [], scale.tolist()
    position = 0
    while position < len(values):
        count = round(1 / values[position])
        counts.append(count)
        position += count
    return counts


def convert_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        num_points: Optional[List[List[int]]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """Map upstream keys to ours.

    Args:
        upstream (dict): Upstream state dict (a ``module.`` prefix is
            dropped).
        reference (dict, optional): Our model's state dict; when given,
            shapes are checked and every reference key must be produced.
        num_points (list[list[int]], optional): The model's sampling points
            per level of each decoder layer; when given, upstream's
            ``num_points_scale`` must agree.
        log (callable): Receives one line per mapped or skipped key.

    Returns:
        dict: The converted state dict.

    Raises:
        ConversionError: listing every problem at once.
    """
    upstream = {_strip_module(k): v for k, v in upstream.items()}
    layer_ids = {
        int(m[1])
        for m in (re.match(r'decoder\.dec_score_head\.(\d+)\.', k)
                  for k in upstream) if m
    }
    rules = _rules(len(layer_ids))
    converted, problems = {}, []
    deploy = sorted(k for k in upstream if DEPLOY.search(k))
    if deploy:
        problems.append(
            f'{deploy[0]} (and {len(deploy) - 1} more) come from upstream\'s '
            'deploy() (fused conv + BN / RepVGG). Convert the checkpoint '
            'saved by training (its "ema" or "model" entry), not an export.')
    for key, value in upstream.items():
        if DERIVED.match(key):
            log(f'skip  {key} (derived, recomputed by the model)')
            continue
        copy = FDR_COPY.match(key)
        if copy:
            outer = upstream.get(f'decoder.{copy[1]}')
            if outer is None or not torch.equal(outer, value):
                problems.append(
                    f'{key} ({value.tolist()}) differs from '
                    f'decoder.{copy[1]}; upstream shares one tensor.')
            log(f'skip  {key} (copy of decoder.{copy[1]})')
            continue
        points = NUM_POINTS_SCALE.match(key)
        if points:
            found = points_per_level(value)
            expected = num_points[int(points[1])] if num_points else None
            if expected is not None and found != expected:
                problems.append(
                    f'{key}: the checkpoint samples {found} points per '
                    f'level, the config {expected} (decoder.layer_cfg.'
                    'num_points). Use the config of the same model size.')
            log(f'skip  {key} (derived: num_points {found})')
            continue
        if DEPLOY.search(key):
            continue
        for pattern, build in rules:
            match = pattern.match(key)
            if match:
                target = build(match)
                converted[target] = value
                log(f'map   {key} -> {target} {tuple(value.shape)}')
                break
        else:
            problems.append(f'unmapped upstream key: {key}')
    _add_num_batches_tracked(converted, log)
    if reference is not None:
        problems += _check_against(converted, reference)
    if problems:
        raise ConversionError('D-FINE checkpoint conversion failed:\n  ' +
                              '\n  '.join(problems))
    return converted


def is_backbone_checkpoint(upstream: Dict[str, torch.Tensor]) -> bool:
    """True for an ImageNet HGNetv2 file (no detector prefix)."""
    keys = [_strip_module(k) for k in upstream]
    return bool(keys) and all(
        BACKBONE_KEY.match(k) and not k.startswith(DETECTOR_PREFIXES)
        for k in keys)


def convert_backbone_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """An ImageNet HGNetv2 state dict, checked (names are unchanged).

    Args:
        upstream (dict): HGNetv2 state dict (keys ``stem.*``,
            ``stages.*``).
        reference (dict, optional): ``model.backbone.state_dict()``.
        log (callable): Receives one line per key.

    Returns:
        dict: The backbone state dict.
    """
    prefix = 'backbone.'
    converted = convert_state_dict(
        {
            prefix + _strip_module(k): v
            for k, v in upstream.items()
        },
        None if reference is None else {
            prefix + k: v
            for k, v in reference.items()
        },
        log=log)
    return {k[len(prefix):]: v for k, v in converted.items()}


def reference_model(config: str):
    """The model that ``config`` builds (random weights)."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings
    cfg = Config.fromfile(config)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
    return MODELS.build(cfg.model)


def model_num_points(model) -> List[List[int]]:
    """Sampling points per level of each decoder layer of a DFINE."""
    return [
        list(layer.cross_attn.num_points_list)
        for layer in model.decoder.layers
    ]


def parse_args():
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
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    try:
        checkpoint = load_checkpoint(args.src, args.trust_pickle)
        upstream, source = select_state_dict(checkpoint)
        backbone = is_backbone_checkpoint(upstream)
        kind = 'ImageNet HGNetv2 backbone' if backbone else 'D-FINE'
        print(f'converting {len(upstream)} tensors ({kind}) from {source}')
        model = reference_model(args.config) if args.config else None
        if backbone:
            converted = convert_backbone_state_dict(
                upstream, model and model.backbone.state_dict())
        else:
            converted = convert_state_dict(
                upstream, model and model.state_dict(),
                model and model_num_points(model))
    except ConversionError as error:
        print(error, file=sys.stderr)
        return 1
    save_converted(converted, args.dst, args.src, source)
    return 0


if __name__ == '__main__':
    sys.exit(main())
