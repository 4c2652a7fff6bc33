"""Official RT-DETR weights (lyuwenyu/RT-DETR) in the port's names.

Two kinds of upstream file convert: v1 (``rtdetr_pytorch``) and v2
(``rtdetrv2_pytorch``) detector checkpoints, and the ImageNet PResNet-vd
backbone files. :func:`select_upstream_weights` reads the layout
upstream's trainer saves, which D-FINE, DEIM and DEIMv2 kept, so their
converters take it from here; loading, the checks against a config's
model and saving are ``mmddp_ext.utils.checkpoint_conversion``'s.
``tools/convert_rtdetr_checkpoint.py`` is the command line;
``rtdetr_upstream_param_names`` is this table's inverse, which
:func:`convert_rtdetr_to_upstream` applies to write the port's weights in
upstream's layout (``--to-upstream``).
"""
import os.path as osp
import re
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from mmddp_ext.utils import (CheckpointConversionError,
                             check_against_reference,
                             convert_submodule_state_dict,
                             derived_decoder_buffers, drop_num_batches_tracked,
                             fill_num_batches_tracked, rename_to_upstream,
                             strip_module_prefix)
from .rtdetr_upstream_param_names import VERSIONS, upstream_name

Log = Callable[[str], None]
StateDict = Dict[str, torch.Tensor]

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


def select_upstream_weights(checkpoint: Dict) -> Tuple[Dict, str]:
    """The model weights of an upstream checkpoint: the EMA weights when
    present (upstream evaluates those), else ``model``, else the dict
    itself when it already maps names to tensors.

    Args:
        checkpoint (dict): The loaded file
            (``mmddp_ext.utils.load_upstream_checkpoint``).

    Returns:
        tuple[dict, str]: The state dict and where it was found
        (``'ema.module'``, ``'model'`` or ``'top level'``).

    Raises:
        CheckpointConversionError: the file holds none of the three.
    """
    ema = checkpoint.get('ema')
    if isinstance(ema, dict) and isinstance(ema.get('module'), dict):
        return ema['module'], 'ema.module'
    if isinstance(checkpoint.get('model'), dict):
        return checkpoint['model'], 'model'
    if checkpoint and all(
            isinstance(v, torch.Tensor) for v in checkpoint.values()):
        return checkpoint, 'top level'
    raise CheckpointConversionError(
        'No weights found: expected an upstream RT-DETR checkpoint with '
        "'ema': {'module': ...} or 'model', or a plain state dict, but got "
        f'top-level keys {sorted(checkpoint)[:10]}.')


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


def convert_rtdetr_state_dict(upstream: StateDict,
                              reference: Optional[StateDict] = None,
                              log: Log = print) -> StateDict:
    """Map the keys of an upstream v1 or v2 RT-DETR detector to the
    ``RTDETR`` model's.

    Args:
        upstream (dict): Upstream state dict (a ``module.`` prefix is
            dropped).
        reference (dict, optional): The model's state dict; when given,
            shapes are checked and every reference key must be produced.
            Defaults to None.
        log (callable): Receives one line per mapped or skipped key.
            Defaults to ``print``.

    Returns:
        dict: The converted state dict.

    Raises:
        CheckpointConversionError: listing unmapped keys, shape mismatches
            and missing keys, all at once.
    """
    upstream = {strip_module_prefix(k): v for k, v in upstream.items()}
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
    fill_num_batches_tracked(converted, log)
    problems += [f'unmapped upstream key: {k}' for k in unmapped]
    if any(DEPLOY_REPVGG.match(k) for k in unmapped):
        problems.append('(RepVGG blocks only in fused deploy form, without '
                        'conv1/conv2: convert the checkpoint saved before '
                        'convert_to_deploy())')
    if reference is not None:
        problems += check_against_reference(converted, reference)
    if problems:
        raise CheckpointConversionError(
            'RT-DETR checkpoint conversion failed:\n  ' +
            '\n  '.join(problems))
    return converted


def _unsupported_features(upstream: StateDict) -> List[str]:
    """v2 decoders with a different number of sampling points per level
    (``num_points: [4, 2, 2]`` etc.): mmcv's MultiScaleDeformableAttention,
    which the port uses, samples the same number on every level, so such
    weights would load into other sampling positions."""
    problems = []
    for key, scale in upstream.items():
        if not (NUM_POINTS_SCALE.match(key) and scale.numel()):
            continue
        if not bool((scale == scale.flatten()[0]).all()):
            problems.append(
                f'{key} holds per-level num_points (1/n per point: '
                f'{scale.tolist()}); the port supports the same num_points '
                'on every level only (decoder.layer_cfg.num_points).')
    return problems


def is_presnet_checkpoint(upstream: StateDict) -> bool:
    """True for an ImageNet PResNet file (no detector prefix, PResNet
    keys), e.g. upstream's ResNet50_vd_ssld_v2_pretrained_from_paddle.pth.

    Args:
        upstream (dict): Upstream state dict.

    Returns:
        bool: Whether it holds a PResNet-vd backbone alone.
    """
    keys = [strip_module_prefix(k) for k in upstream]
    return bool(keys) and all(
        BACKBONE_KEY.match(k) and not k.startswith(DETECTOR_PREFIXES)
        for k in keys)


def convert_presnet_state_dict(upstream: StateDict,
                               reference: Optional[StateDict] = None,
                               log: Log = print) -> StateDict:
    """Map an ImageNet PResNet-vd state dict to ``ResNetVdRTDETR``'s keys.

    The detector rules apply with a ``backbone.`` prefix added to the
    upstream keys and removed from ours, so both kinds of file share one
    table.

    Args:
        upstream (dict): PResNet state dict (keys ``conv1.*``,
            ``res_layers.*``).
        reference (dict, optional): The backbone's state dict
            (``model.backbone.state_dict()``); when given, shapes are
            checked and every key must be produced. Defaults to None.
        log (callable): Receives one line per mapped key. Defaults to
            ``print``.

    Returns:
        dict: The converted backbone state dict.
    """
    return convert_submodule_state_dict(
        convert_rtdetr_state_dict, upstream, reference, log=log)


def refuse_discrete_sampling(src: str) -> None:
    """Refuse upstream's ``_dsp`` checkpoints.

    They were trained with ``cross_attn_method: discrete`` (nearest-cell
    sampling). Their weights look like the default ones, and the port
    samples bilinearly, so they would load and give other outputs; the
    file name is the only marker upstream leaves.

    Args:
        src (str): Path of the upstream file.

    Raises:
        CheckpointConversionError: the file name marks a dsp checkpoint.
    """
    if '_dsp' in osp.basename(src):
        raise CheckpointConversionError(
            f'{src} looks like an rtdetrv2 discrete-sampling checkpoint '
            "('_dsp', cross_attn_method: discrete). The port implements "
            'bilinear sampling only, so its outputs would differ. Convert '
            'the non-dsp checkpoint of the same model instead (e.g. '
            'rtdetrv2_r18vd_120e_coco.pth for rtdetrv2_r18vd_dsp_3x); rename '
            'the file if it is not a dsp model.')


def convert_rtdetr_to_upstream(state: StateDict,
                               model: nn.Module,
                               version: int,
                               eval_size: Optional[Tuple[int,
                                                         int]] = (640, 640),
                               log: Log = print) -> StateDict:
    """The port's state dict in upstream's names and layout, the inverse of
    :func:`convert_rtdetr_state_dict`, for upstream's ``train.py -r/-t``
    and ``tools/export_onnx.py`` (which load strictly).

    Names come from the inverse table (``rtdetr_upstream_param_names``,
    v1's or v2's). What the forward conversion drops or fills is undone
    here:

    - the BN counters it fills for a frozen backbone (upstream's
      ``freeze_norm``, the port's ``norm_cfg.requires_grad=False``:
      ``FrozenBatchNorm2d`` stores none) are dropped;
    - v2's buffers it skips as derived are written: ``decoder.anchors`` and
      ``decoder.valid_mask`` for ``eval_size`` (the model's
      ``generate_anchors`` on its feature levels at that size, bit for bit
      upstream's ``_generate_anchors``) and each decoder layer's
      ``num_points_scale`` (``1 / num_points`` per point, float32, as
      upstream builds it);
    - the deploy-form RepVGG convs it skips are not written: upstream saves
      the training form;
    - discrete-sampling (``_dsp``) files, which it refuses, have no
      inverse: the port samples bilinearly, so the result is for upstream's
      default ``cross_attn_method``.

    Args:
        state (dict): The port's state dict.
        model (nn.Module): The config's model, on any device (``'meta'``
            suffices): its keys and shapes check ``state``; it gives the
            decoder depth, the backbone's frozen norms, the sampling points
            and the feature levels.
        version (int): 1 for ``rtdetr_pytorch``'s names, 2 for
            ``rtdetrv2_pytorch``'s.
        eval_size (tuple[int, int], optional): Upstream's
            ``eval_spatial_size`` (height, width), for v2's anchors (v1
            caches none). Defaults to (640, 640).
        log (callable): Receives one line per key. Defaults to ``print``.

    Returns:
        dict: The upstream state dict.

    Raises:
        ValueError: ``version`` is not 1 or 2.
        CheckpointConversionError: listing every problem at once.
    """
    if version not in VERSIONS:
        raise ValueError(f'version must be 1 (rtdetr_pytorch) or 2 '
                         f'(rtdetrv2_pytorch), got {version!r}.')
    problems = check_against_reference(state, model.state_dict())
    norm_cfg = getattr(model.backbone, 'norm_cfg', None) or {}
    if norm_cfg.get('requires_grad', True) is False:
        state = drop_num_batches_tracked(state, 'backbone.', log)
    num_layers = len(model.bbox_head.cls_branches) - 1
    upstream, unnamed = rename_to_upstream(
        state, lambda key: upstream_name(key, version, num_layers), log)
    problems += unnamed
    if version == 2:
        layer_points = [[layer.cross_attn.num_points] *
                        layer.cross_attn.num_levels
                        for layer in model.decoder.layers]
        upstream.update(
            derived_decoder_buffers(model, eval_size, layer_points, log))
    if problems:
        raise CheckpointConversionError(
            'RT-DETR conversion to upstream failed:\n  ' +
            '\n  '.join(problems))
    return upstream
