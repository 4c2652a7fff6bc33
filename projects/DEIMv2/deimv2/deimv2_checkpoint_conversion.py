"""Official DEIMv2 (Intellindust-AI-Lab/DEIMv2) weights in the port's
names.

DEIMv2's decoder keeps D-FINE's module names, so a detector checkpoint
maps key for key as D-FINE's does (``convert_dfine_state_dict``, through
``ports``); what is DEIMv2's own is the check of the box branch that
Atto, Femto and Pico share, and the two kinds of backbone file DEIMv2
starts from: the ViTs of the DINOv3 sizes and B0's ImageNet HGNetv2 file,
which upstream loads into the lighter sizes partly.
``tools/convert_deimv2_checkpoint.py`` is the command line.
"""
import re
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn

from mmddp_ext.utils import (CheckpointConversionError,
                             check_against_reference, strip_module_prefix)
from .ports import convert_dfine_state_dict, decoder_num_points

Log = Callable[[str], None]
StateDict = Dict[str, torch.Tensor]

VIT_KEY = re.compile(r'(blocks\.\d+\.|patch_embed\.|cls_token$)')
BRANCH = re.compile(r'^decoder\.(dec_bbox_head|dec_score_head)\.(\d+)\.(.+)$')


def is_vit_checkpoint(upstream: StateDict) -> bool:
    """True for a backbone-only ViT file (no detector prefix), e.g.
    ``vitt_distill.pt`` or DINOv3's ``dinov3_vits16*_pretrain_*.pth``.

    Args:
        upstream (dict): Upstream state dict.

    Returns:
        bool: Whether it holds a ViT alone.
    """
    keys = [strip_module_prefix(k) for k in upstream]
    return any(VIT_KEY.match(k) for k in keys) and not any(
        k.startswith(('backbone.', 'encoder.', 'decoder.')) for k in keys)


def _shared_copy_problems(upstream: StateDict,
                          model: Optional[nn.Module]) -> List[str]:
    """Upstream keys of one shared branch (the model lists one module
    under several indices) that differ from index 0's."""
    if model is None:
        return []
    shared = {
        'dec_bbox_head': model.bbox_head.reg_branches,
        'dec_score_head': model.bbox_head.cls_branches
    }
    problems = []
    for key, value in upstream.items():
        match = BRANCH.match(strip_module_prefix(key))
        if not match or match[2] == '0':
            continue
        branches = shared[match[1]]
        if branches[int(match[2])] is not branches[0]:
            continue
        first = upstream.get(f'decoder.{match[1]}.0.{match[3]}')
        if first is None or not torch.equal(first, value):
            problems.append(
                f'{key} differs from decoder.{match[1]}.0.{match[3]}, but '
                'the config shares this branch (share_bbox_head / '
                'share_score_head): use the config of the same model size.')
    return problems


def convert_deimv2_state_dict(upstream: StateDict,
                              model: Optional[nn.Module] = None,
                              log: Log = print) -> StateDict:
    """A DEIMv2 detector state dict in the port's names.

    Args:
        upstream (dict): Upstream state dict.
        model (DEIMv2, optional): The config's model; when given, every
            shape, the sampling points and the shared branches are checked
            and every model key must be produced. Defaults to None.
        log (callable): Receives one line per key. Defaults to ``print``.

    Returns:
        dict: The converted state dict.

    Raises:
        CheckpointConversionError: listing every problem at once.
    """
    problems = _shared_copy_problems(upstream, model)
    if problems:
        raise CheckpointConversionError(
            'DEIMv2 checkpoint conversion failed:\n  ' + '\n  '.join(problems))
    return convert_dfine_state_dict(upstream, model and model.state_dict(),
                                    model and decoder_num_points(model), log)


def convert_deimv2_vit_state_dict(upstream: StateDict,
                                  reference: Optional[StateDict] = None,
                                  log: Log = print) -> StateDict:
    """A ViT file, checked (names are unchanged).

    Args:
        upstream (dict): The ViT state dict.
        reference (dict, optional): ``model.backbone.vit.state_dict()``;
            when given, shapes are checked and every key must be present.
            Defaults to None.
        log (callable): Receives one line per key. Defaults to ``print``.

    Returns:
        dict: The ViT state dict.

    Raises:
        CheckpointConversionError: the file does not fit ``reference``.
    """
    converted = {strip_module_prefix(k): v for k, v in upstream.items()}
    for key, value in converted.items():
        log(f'keep  {key} {tuple(value.shape)}')
    if reference is not None:
        problems = check_against_reference(converted, reference)
        if problems:
            raise CheckpointConversionError(
                'DEIMv2 ViT file check failed (is it the file of this '
                'size? S: vitt_distill.pt, M: vittplus_distill.pt, L: '
                'dinov3_vits16, X: dinov3_vits16plus):\n  ' +
                '\n  '.join(problems))
    return converted


def convert_deimv2_hgnetv2_state_dict(upstream: StateDict,
                                      reference: Optional[StateDict] = None,
                                      log: Log = print) -> StateDict:
    """An ImageNet HGNetv2 file; with a ``reference`` only the keys it has
    with the same shape are kept, as upstream loads B0's file into Atto,
    Femto and Pico.

    Args:
        upstream (dict): HGNetv2 state dict (keys ``stem.*``,
            ``stages.*``).
        reference (dict, optional): ``model.backbone.state_dict()``.
            Defaults to None (every key kept).
        log (callable): Receives one line per kept or dropped key.
            Defaults to ``print``.

    Returns:
        dict: The kept state dict.

    Raises:
        CheckpointConversionError: no key fits ``reference``.
    """
    converted = {strip_module_prefix(k): v for k, v in upstream.items()}
    if reference is None:
        return converted
    kept = {}
    for key, value in converted.items():
        if key in reference and reference[key].shape == value.shape:
            kept[key] = value
            log(f'keep  {key} {tuple(value.shape)}')
        else:
            log(f'drop  {key} {tuple(value.shape)} (not in this backbone '
                'or another shape)')
    if not kept:
        raise CheckpointConversionError(
            'DEIMv2 HGNetv2 file: no key matches the config\'s backbone; '
            'pass the config of a HGNetv2 size.')
    return kept
