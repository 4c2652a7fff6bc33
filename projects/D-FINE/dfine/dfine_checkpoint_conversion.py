"""Official D-FINE (Peterande/D-FINE) and DEIM-D-FINE (ShihuaHuang95/DEIM)
weights in the port's names.

Upstream's names below each module are the port's; the modules are filed
the mmdet way (``neck`` for upstream's ``encoder``, the prediction
branches in ``bbox_head``). Loading, the checks against a config's model
and saving are ``mmddp_ext.utils.checkpoint_conversion``'s.
``tools/convert_dfine_checkpoint.py`` is the command line (it picks a
file's weights with RT-DETR's ``select_upstream_weights``: upstream
saves them as RT-DETR does); ``dfine_upstream_param_names`` is this
table's inverse, which :func:`convert_dfine_to_upstream` applies to write
the port's weights in upstream's layout (``--to-upstream``; DEIM-D-FINE
and DEIMv2 too).
"""
import re
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

from mmddp_ext.utils import (CheckpointConversionError,
                             check_against_reference,
                             convert_submodule_state_dict,
                             derived_decoder_buffers, drop_num_batches_tracked,
                             fill_num_batches_tracked, rename_to_upstream,
                             strip_module_prefix, upstream_eval_size)
from .dfine_upstream_param_names import upstream_name

Log = Callable[[str], None]
StateDict = Dict[str, torch.Tensor]

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


def _points_from_scale(scale: torch.Tensor) -> List[int]:
    """Sampling points per level from upstream's ``num_points_scale``
    (``1 / n`` repeated ``n`` times per level)."""
    counts, values = [], scale.tolist()
    position = 0
    while position < len(values):
        count = round(1 / values[position])
        counts.append(count)
        position += count
    return counts


def convert_dfine_state_dict(upstream: StateDict,
                             reference: Optional[StateDict] = None,
                             num_points: Optional[List[List[int]]] = None,
                             log: Log = print) -> StateDict:
    """Map the keys of an upstream D-FINE (or DEIM-D-FINE) detector to the
    ``DFINE`` model's.

    Args:
        upstream (dict): Upstream state dict (a ``module.`` prefix is
            dropped).
        reference (dict, optional): The model's state dict; when given,
            shapes are checked and every reference key must be produced.
            Defaults to None.
        num_points (list[list[int]], optional): The model's sampling points
            per level of each decoder layer (:func:`decoder_num_points`);
            when given, upstream's ``num_points_scale`` must agree.
            Defaults to None.
        log (callable): Receives one line per mapped or skipped key.
            Defaults to ``print``.

    Returns:
        dict: The converted state dict.

    Raises:
        CheckpointConversionError: listing every problem at once.
    """
    upstream = {strip_module_prefix(k): v for k, v in upstream.items()}
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
            found = _points_from_scale(value)
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
    fill_num_batches_tracked(converted, log)
    if reference is not None:
        problems += check_against_reference(converted, reference)
    if problems:
        raise CheckpointConversionError(
            'D-FINE checkpoint conversion failed:\n  ' + '\n  '.join(problems))
    return converted


def is_hgnetv2_checkpoint(upstream: StateDict) -> bool:
    """True for an ImageNet HGNetv2 file (no detector prefix), e.g.
    upstream's ``PPHGNetV2_B0_stage1.pth``.

    Args:
        upstream (dict): Upstream state dict.

    Returns:
        bool: Whether it holds an HGNetv2 backbone alone.
    """
    keys = [strip_module_prefix(k) for k in upstream]
    return bool(keys) and all(
        BACKBONE_KEY.match(k) and not k.startswith(DETECTOR_PREFIXES)
        for k in keys)


def convert_hgnetv2_state_dict(upstream: StateDict,
                               reference: Optional[StateDict] = None,
                               log: Log = print) -> StateDict:
    """An ImageNet HGNetv2 state dict, checked (names are unchanged).

    Args:
        upstream (dict): HGNetv2 state dict (keys ``stem.*``,
            ``stages.*``).
        reference (dict, optional): ``model.backbone.state_dict()``; when
            given, shapes are checked and every key must be produced.
            Defaults to None.
        log (callable): Receives one line per key. Defaults to ``print``.

    Returns:
        dict: The backbone state dict.
    """
    return convert_submodule_state_dict(
        convert_dfine_state_dict, upstream, reference, log=log)


def decoder_num_points(model: nn.Module) -> List[List[int]]:
    """Sampling points per level of each decoder layer of a D-FINE-family
    model, for :func:`convert_dfine_state_dict`'s ``num_points``.

    Args:
        model (nn.Module): A ``DFINE`` (or a model built on it).

    Returns:
        list[list[int]]: One list per decoder layer.
    """
    return [
        list(layer.cross_attn.num_points_list)
        for layer in model.decoder.layers
    ]


def convert_dfine_to_upstream(state: StateDict,
                              model: nn.Module,
                              eval_size: Tuple[int, int] = (640, 640),
                              log: Log = print) -> StateDict:
    """The port's state dict in upstream's names and layout, the inverse of
    :func:`convert_dfine_state_dict`, for upstream's ``train.py -r/-t``
    and ``tools/deployment/export_onnx.py`` (which load strictly). Serves
    D-FINE, DEIM-D-FINE and DEIMv2, whose decoders keep D-FINE's names.

    Names come from the inverse table (``dfine_upstream_param_names``).
    What the forward conversion drops or fills is undone here:

    - the BN counters it fills for a frozen backbone (``freeze_norm``:
      upstream's ``FrozenBatchNorm2d`` stores none) are dropped;
    - the buffers it skips as derived are written: ``decoder.anchors`` and
      ``decoder.valid_mask`` for ``eval_size`` (the model's
      ``generate_anchors`` on its feature levels at that size, bit for bit
      upstream's ``_generate_anchors``), each decoder layer's
      ``num_points_scale`` (``1 / n`` per point of a level sampling ``n``,
      float32, as upstream builds it), and the inner decoder's
      ``decoder.decoder.up`` / ``reg_scale``, the tensors of
      ``decoder.up`` / ``reg_scale`` (one shared parameter upstream);
    - the deploy-form keys it refuses have no inverse: upstream saves the
      training form.

    Where a config shares a branch (DEIMv2 Atto, Femto, Pico), the port's
    state dict repeats it under every layer index, as upstream saves it.

    Args:
        state (dict): The port's state dict.
        model (nn.Module): The config's model, on any device (``'meta'``
            suffices): its keys and shapes check ``state``; it gives the
            decoder depth, the backbone's frozen norms, the sampling points
            and the feature levels.
        eval_size (tuple[int, int]): Upstream's ``eval_spatial_size``
            (height, width), for the anchors. Defaults to (640, 640).
        log (callable): Receives one line per key. Defaults to ``print``.

    Returns:
        dict: The upstream state dict.

    Raises:
        CheckpointConversionError: listing every problem at once.
    """
    problems = check_against_reference(state, model.state_dict())
    if getattr(model.backbone, 'freeze_norm', False):
        state = drop_num_batches_tracked(state, 'backbone.', log)
    num_layers = len(model.bbox_head.cls_branches) - 1
    upstream, unnamed = rename_to_upstream(
        state, lambda key: upstream_name(key, num_layers), log)
    problems += unnamed
    for name in ('up', 'reg_scale'):
        if f'decoder.{name}' in upstream:
            upstream[f'decoder.decoder.{name}'] = upstream[f'decoder.{name}']
            log(f'copy  decoder.decoder.{name} = decoder.{name}')
    upstream.update(
        derived_decoder_buffers(model, eval_size, decoder_num_points(model),
                                log))
    if problems:
        raise CheckpointConversionError(
            'D-FINE conversion to upstream failed:\n  ' +
            '\n  '.join(problems))
    return upstream


def dfine_upstream_converter(eval_size: Optional[Tuple[int, int]] = None):
    """What ``--to-upstream`` of the D-FINE-family converters runs
    (D-FINE, DEIM-D-FINE and DEIMv2 share upstream's D-FINE names):
    ``converter(cfg, model)`` binds :func:`convert_dfine_to_upstream` to
    the config's model and test size.

    Args:
        eval_size (tuple[int, int], optional): Upstream's
            ``eval_spatial_size``; None takes the config's test Resize.
            Defaults to None.
    """

    def converter(cfg, model: nn.Module):
        size = upstream_eval_size(cfg, eval_size)
        return ((lambda state, log: convert_dfine_to_upstream(
            state, model, size, log)), None)

    return converter
