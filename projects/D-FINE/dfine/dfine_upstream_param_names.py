"""Upstream D-FINE / DEIM parameter names for the port's, for upstream's
optimizer regexes (``RegexOptimWrapperConstructor.param_name_map``).

Upstream's YAML groups parameters by regexes over its own names
(``backbone.stages.0.blocks.0.layers.0.conv.weight``,
``encoder.fpn_blocks.0.cv1.norm.weight``, ``decoder.dec_score_head.0.bias``).
The port keeps upstream's names below each module but files the modules
the mmdet way (``neck`` for upstream's ``encoder``, the prediction
branches in ``bbox_head``), so the regexes must see the upstream name of
each parameter: this is the inverse of
``dfine_checkpoint_conversion``'s table.
"""
import re
from typing import Callable, Dict, List, Tuple

import torch.nn as nn
from mmengine.registry import FUNCTIONS


def _rules(num_layers: int) -> List[Tuple[re.Pattern, Callable]]:
    """(pattern on the port's name, upstream name builder)."""
    table = [
        (r'backbone\.(.+)', lambda m: f'backbone.{m[1]}'),
        (r'neck\.(.+)', lambda m: f'encoder.{m[1]}'),
        (r'input_proj\.(.+)', lambda m: f'decoder.input_proj.{m[1]}'),
        (r'decoder\.(layers|lqe_layers)\.(.+)',
         lambda m: f'decoder.decoder.{m[1]}.{m[2]}'),
        (r'decoder\.(up|reg_scale)', lambda m: f'decoder.{m[1]}'),
        (r'dn_query_generator\.label_embedding\.(.+)',
         lambda m: f'decoder.denoising_class_embed.{m[1]}'),
        (r'(query_pos_head|enc_output)\.(.+)',
         lambda m: f'decoder.{m[1]}.{m[2]}'),
        (r'bbox_head\.cls_branches\.(\d+)\.(.+)',
         lambda m: f'decoder.enc_score_head.{m[2]}' if int(m[
             1]) == num_layers else f'decoder.dec_score_head.{m[1]}.{m[2]}'),
        (r'bbox_head\.reg_branches\.(\d+)\.(.+)',
         lambda m: f'decoder.enc_bbox_head.{m[2]}'
         if int(m[1]) == num_layers else f'decoder.dec_bbox_head.{m[1]}.{m[2]}'
         ),
        (r'bbox_head\.pre_bbox_head\.(.+)',
         lambda m: f'decoder.pre_bbox_head.{m[1]}'),
    ]
    return [(re.compile(pattern + '$'), build) for pattern, build in table]


def upstream_name(name: str, num_layers: int) -> str:
    """Upstream's name of the port's parameter or buffer ``name`` in a
    model with ``num_layers`` decoder layers.

    Raises:
        ValueError: No rule covers ``name``.
    """
    for pattern, build in _rules(num_layers):
        match = pattern.match(name)
        if match:
            return build(match)
    raise ValueError(f'No upstream D-FINE name for {name!r}: the port has a '
                     'module upstream does not.')


@FUNCTIONS.register_module()
def dfine_upstream_param_names(model: nn.Module) -> Dict[str, str]:
    """``{port name: upstream name}`` for every parameter of a ``DFINE``
    model, for ``RegexOptimWrapperConstructor``'s ``param_name_map``
    (D-FINE's and DEIM-D-FINE's YAML regexes).

    Args:
        model (nn.Module): The ``DFINE`` detector (not wrapped).

    Returns:
        dict: Upstream's name of each parameter, by the port's name.
    """
    # the encoder's pair is the last branch: one per decoder layer before it
    num_layers = len(model.bbox_head.cls_branches) - 1
    return {
        name: upstream_name(name, num_layers)
        for name, _ in model.named_parameters()
    }
