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
import pickle
import re
import sys
from typing import Callable, Dict, List, Optional, Tuple

import torch

# Keys upstream stores that the model derives itself (anchors of the
# eval size, the 1/num_points scale of v2's deformable attention).
DERIVED = [
    re.compile(r'^decoder\.(anchors|valid_mask)$'),
    re.compile(r'^decoder\.decoder\.layers\.\d+\.cross_attn\.'
               r'num_points_scale$'),
]
# A RepVGG block fused by upstream's convert_to_deploy(): one biased 3x3
# conv next to (after deploy()) or instead of the conv1/conv2 branches the
# model has.
DEPLOY_REPVGG = re.compile(r'(.*\.bottlenecks\.\d+)\.conv\.(weight|bias)$')
# Top-level modules of an upstream detector; a file with none of them and
# only PResNet keys is an ImageNet backbone.
DETECTOR_PREFIXES = ('backbone.', 'encoder.', 'decoder.')
BACKBONE_KEY = re.compile(r'(conv1|res_layers)\.')
NUM_POINTS_SCALE = re.compile(r'^decoder\.decoder\.layers\.\d+\.cross_attn\.'
                              r'num_points_scale$')


class ConversionError(RuntimeError):
    """Upstream keys without a rule, or shapes that do not fit."""


def _reg_index(layer: str) -> str:
    # upstream MLP layers.k (Linear) -> mmdet reg branch Sequential index
    return str(2 * int(layer))


def _rules(num_layers: int) -> List[Tuple[re.Pattern, Callable]]:
    """(pattern, target builder) pairs; the first full match wins."""
    bn = r'(weight|bias|running_mean|running_var|num_batches_tracked)'
    branch = {'a': '1', 'b': '2', 'c': '3'}
    table = [
        # PResNet-vd -> ResNetVdRTDETR (mmdet ResNetV1d layout)
        (r'backbone\.conv1\.conv1_(\d)\.conv\.weight',
         lambda m: f'backbone.stem.{3 * (int(m[1]) - 1)}.weight'),
        (r'backbone\.conv1\.conv1_(\d)\.norm\.' + bn,
         lambda m: f'backbone.stem.{3 * (int(m[1]) - 1) + 1}.{m[2]}'),
        (r'backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.branch2([abc])'
         r'\.conv\.weight', lambda m:
         f'backbone.layer{int(m[1]) + 1}.{m[2]}.conv{branch[m[3]]}.weight'),
        (r'backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.branch2([abc])'
         r'\.norm\.' + bn, lambda m:
         f'backbone.layer{int(m[1]) + 1}.{m[2]}.bn{branch[m[3]]}.{m[4]}'),
        (r'backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.short(\.conv)?'
         r'\.conv\.weight',
         lambda m: f'backbone.layer{int(m[1]) + 1}.{m[2]}.downsample.1.weight'
         ),
        (r'backbone\.res_layers\.(\d+)\.blocks\.(\d+)\.short(\.conv)?'
         r'\.norm\.' + bn,
         lambda m: f'backbone.layer{int(m[1]) + 1}.{m[2]}.downsample.2.{m[4]}'
         ),
        # HybridEncoder -> neck (v1 Sequential indices, v2 conv/norm)
        (r'encoder\.input_proj\.(\d+)\.(0|conv)\.weight',
         lambda m: f'neck.input_proj.{m[1]}.0.weight'),
        (r'encoder\.input_proj\.(\d+)\.(1|norm)\.' + bn,
         lambda m: f'neck.input_proj.{m[1]}.1.{m[3]}'),
        (r'encoder\.((encoder|lateral_convs|fpn_blocks|downsample_convs|'
         r'pan_blocks)\..+)', lambda m: f'neck.{m[1]}'),
        # RTDETRTransformer -> detector, decoder and head
        (r'decoder\.input_proj\.(\d+)\.(conv|norm)\.(.+)',
         lambda m: f'input_proj.{m[1]}.{m[2]}.{m[3]}'),
        (r'decoder\.decoder\.layers\.(\d+)\.(.+)',
         lambda m: f'decoder.layers.{m[1]}.{m[2]}'),
        (r'decoder\.denoising_class_embed\.weight',
         lambda m: 'dn_query_generator.label_embedding.weight'),
        (r'decoder\.query_pos_head\.layers\.(\d)\.(weight|bias)',
         lambda m: f'query_pos_head.layers.{m[1]}.{m[2]}'),
        (r'decoder\.enc_output\.(0|proj)\.(weight|bias)',
         lambda m: f'enc_output.0.{m[2]}'),
        (r'decoder\.enc_output\.(1|norm)\.(weight|bias)',
         lambda m: f'enc_output.1.{m[2]}'),
        (r'decoder\.enc_score_head\.(weight|bias)',
         lambda m: f'bbox_head.cls_branches.{num_layers}.{m[1]}'),
        (r'decoder\.enc_bbox_head\.layers\.(\d)\.(weight|bias)',
         lambda m: f'bbox_head.reg_branches.{num_layers}.'
         f'{_reg_index(m[1])}.{m[2]}'),
        (r'decoder\.dec_score_head\.(\d+)\.(weight|bias)',
         lambda m: f'bbox_head.cls_branches.{m[1]}.{m[2]}'),
        (r'decoder\.dec_bbox_head\.(\d+)\.layers\.(\d)\.(weight|bias)',
         lambda m: f'bbox_head.reg_branches.{m[1]}.'
         f'{_reg_index(m[2])}.{m[3]}'),
    ]
    return [(re.compile(pattern + '$'), build) for pattern, build in table]


def select_state_dict(checkpoint: Dict) -> Tuple[Dict, str]:
    """The model weights of an upstream checkpoint: the EMA weights when
    present (upstream evaluates those), else ``model``, else the dict
    itself when it already maps names to tensors."""
    ema = checkpoint.get('ema')
    if isinstance(ema, dict) and isinstance(ema.get('module'), dict):
        return ema['module'], 'ema.module'
    if isinstance(checkpoint.get('model'), dict):
        return checkpoint['model'], 'model'
    if checkpoint and all(
            isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return checkpoint, 'top level'
    raise ConversionError(
        'No weights found: expected an upstream RT-DETR checkpoint with '
        "'ema': {'module': ...} or 'model', or a plain state dict, but got "
        f'top-level keys {sorted(checkpoint)[:10]}.')


def convert_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """Map upstream keys to ours.

    Args:
        upstream (dict): Upstream state dict (a ``module.`` prefix is
            dropped).
        reference (dict, optional): Our model's state dict; when given,
            shapes are checked and every reference key must be produced.
        log (callable): Receives one line per mapped or skipped key.

    Returns:
        dict: The converted state dict.

    Raises:
        ConversionError: listing unmapped keys, shape mismatches and
            missing keys, all at once.
    """
    upstream = {_strip_module(k): v for k, v in upstream.items()}
    layer_ids = {
        int(m[1])
        for m in (re.match(r'decoder\.dec_score_head\.(\d+)\.', k)
                  for k in upstream) if m
    }
    rules = _rules(len(layer_ids))
    converted, unmapped = {}, []
    problems = _unsupported_features(upstream)
    for key, value in upstream.items():
        if any(p.match(key) for p in DERIVED):
            log(f'skip  {key} (derived, recomputed by the model)')
            continue
        fused = DEPLOY_REPVGG.match(key)
        if fused:
            if f'{fused[1]}.conv1.conv.weight' in upstream:
                log(f'skip  {key} (deploy-form copy of conv1 + conv2)')
            else:
                unmapped.append(key)
            continue
        for pattern, build in rules:
            match = pattern.match(key)
            if match:
                target = build(match)
                converted[target] = value
                log(f'map   {key} -> {target} {tuple(value.shape)}')
                break
        else:
            unmapped.append(key)
    _add_num_batches_tracked(converted, log)
    problems += [f'unmapped upstream key: {k}' for k in unmapped]
    if any(DEPLOY_REPVGG.match(k) for k in unmapped):
        problems.append('(RepVGG blocks only in fused deploy form, without '
                        'conv1/conv2: convert the checkpoint saved before '
                        'convert_to_deploy())')
    if reference is not None:
        problems += _check_against(converted, reference)
    if problems:
        raise ConversionError('RT-DETR checkpoint conversion failed:\n  ' +
                              '\n  '.join(problems))
    return converted


def _unsupported_features(upstream: Dict[str, torch.Tensor]) -> List[str]:
    """v2 decoders with a different number of sampling points per level
    (``num_points: [4, 2, 2]`` etc.): mmcv's MultiScaleDeformableAttention,
    which the port uses, samples the same number on every level, so such
    weights would load into other sampling positions."""
    problems = []
    for key, scale in upstream.items():
        if NUM_POINTS_SCALE.match(key) and scale.numel() and not bool(
            (scale == scale.flatten()[0]).all()):
            problems.append(
                f'{key} holds per-level num_points (1/n per point: '
                f'{scale.tolist()}); the port supports the same num_points '
                'on every level only (decoder.layer_cfg.num_points).')
    return problems


def is_backbone_checkpoint(upstream: Dict[str, torch.Tensor]) -> bool:
    """True for an ImageNet PResNet file (no detector prefix, PResNet
    keys), e.g. upstream's ResNet50_vd_ssld_v2_pretrained_from_paddle.pth.
    """
    keys = [_strip_module(k) for k in upstream]
    return bool(keys) and all(
        BACKBONE_KEY.match(k) and not k.startswith(DETECTOR_PREFIXES)
        for k in keys)


def _strip_module(key: str) -> str:
    """Drop the ``module.`` prefix of (D)DP-wrapped checkpoints."""
    return key[len('module.'):] if key.startswith('module.') else key


def convert_backbone_state_dict(
        upstream: Dict[str, torch.Tensor],
        reference: Optional[Dict[str, torch.Tensor]] = None,
        log: Callable[[str], None] = print) -> Dict[str, torch.Tensor]:
    """Map an ImageNet PResNet-vd state dict to ``ResNetVdRTDETR``'s keys.

    The detector rules apply with a ``backbone.`` prefix added to the
    upstream keys and removed from ours, so both modes share one table.

    Args:
        upstream (dict): PResNet state dict (keys ``conv1.*``,
            ``res_layers.*``).
        reference (dict, optional): The backbone's state dict
            (``model.backbone.state_dict()``); when given, shapes are
            checked and every key must be produced.
        log (callable): Receives one line per mapped key.

    Returns:
        dict: The converted backbone state dict.
    """
    prefix = 'backbone.'
    converted = convert_state_dict(
        {prefix + _strip_module(k): v
         for k, v in upstream.items()},
        None if reference is None else
        {prefix + k: v
         for k, v in reference.items()},
        log=log)
    return {k[len(prefix):]: v for k, v in converted.items()}


def _add_num_batches_tracked(converted: Dict, log: Callable) -> None:
    """Frozen BN layers (upstream ``freeze_norm``) store no
    ``num_batches_tracked``; our BN layers do. Fill it with 0."""
    for key in [k for k in converted if k.endswith('.running_mean')]:
        counter = key[:-len('running_mean')] + 'num_batches_tracked'
        if counter not in converted:
            converted[counter] = torch.tensor(0, dtype=torch.long)
            log(f'fill  {counter} = 0 (frozen BN upstream)')


def _check_against(converted: Dict, reference: Dict) -> List[str]:
    problems = []
    for key, value in converted.items():
        if key not in reference:
            problems.append(f'converted key not in the model: {key}')
        elif tuple(value.shape) != tuple(reference[key].shape):
            problems.append(
                f'shape mismatch: {key} converted {tuple(value.shape)}, '
                f'model {tuple(reference[key].shape)}')
    problems += [
        f'model key missing from the checkpoint: {key}' for key in reference
        if key not in converted
    ]
    return problems


def reference_state_dict(config: str,
                         backbone_only: bool = False
                         ) -> Dict[str, torch.Tensor]:
    """State dict of the model that ``config`` builds (random weights), or
    of its backbone."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings
    cfg = Config.fromfile(config)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
    if backbone_only:
        return MODELS.build(cfg.model.backbone).state_dict()
    return MODELS.build(cfg.model).state_dict()


def parse_args():
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
    return parser.parse_args()


def _refuse_discrete_sampling(src: str) -> None:
    """Upstream's ``_dsp`` checkpoints were trained with
    ``cross_attn_method: discrete`` (nearest-cell sampling). Their weights
    look like the default ones, and the port samples bilinearly, so they
    would load and give other outputs; the file name is the only
    marker upstream leaves."""
    if '_dsp' in osp.basename(src):
        raise ConversionError(
            f'{src} looks like an rtdetrv2 discrete-sampling checkpoint '
            "('_dsp', cross_attn_method: discrete). The port implements "
            'bilinear sampling only, so its outputs would differ. Convert '
            'the non-dsp checkpoint of the same model instead (e.g. '
            'rtdetrv2_r18vd_120e_coco.pth for rtdetrv2_r18vd_dsp_3x); rename '
            'the file if it is not a dsp model.')


def load_checkpoint(src: str, trust_pickle: bool = False) -> Dict:
    """``torch.load`` of an upstream file on the CPU, tensors only unless
    ``trust_pickle``; a file the safe loader refuses raises
    :class:`ConversionError` saying how to proceed."""
    try:
        return torch.load(
            src, map_location='cpu', weights_only=not trust_pickle)
    except pickle.UnpicklingError as error:
        raise ConversionError(
            f'{src} holds objects other than tensors (e.g. an optimizer or '
            'scheduler state), which the safe loader refuses. If you trust '
            f'the file, rerun with --trust-pickle.\n{error}') from error


def save_converted(converted: Dict[str, torch.Tensor], dst: str, src: str,
                   source: str) -> None:
    """Write ``converted`` as a checkpoint ``load_from`` and ``init_cfg``
    read, noting where it came from."""
    torch.save(
        {
            'state_dict': converted,
            'meta': dict(converted_from=src, source=source)
        }, dst)
    print(f'saved {len(converted)} tensors to {dst}')


def main() -> int:
    args = parse_args()
    try:
        checkpoint = load_checkpoint(args.src, args.trust_pickle)
        upstream, source = select_state_dict(checkpoint)
        _refuse_discrete_sampling(args.src)
        backbone = is_backbone_checkpoint(upstream)
        kind = 'ImageNet PResNet backbone' if backbone else 'RT-DETR'
        print(f'converting {len(upstream)} tensors ({kind}) from {source}')
        reference = (
            reference_state_dict(args.config, backbone)
            if args.config else None)
        convert = (
            convert_backbone_state_dict if backbone else convert_state_dict)
        converted = convert(upstream, reference)
    except ConversionError as error:
        print(error, file=sys.stderr)
        return 1
    save_converted(converted, args.dst, args.src, source)
    return 0


if __name__ == '__main__':
    sys.exit(main())
