"""Upstream RT-DETR's parameter names for the port's, for upstream's
optimizer regexes (``RegexOptimWrapperConstructor.param_name_map``).

Upstream's YAML groups parameters by regexes over its own names
(``backbone.res_layers.0.blocks.0.branch2a.norm.weight``,
``decoder.dec_score_head.0.bias``, ...). The port keeps mmdet's layout
(``backbone.layer1.0.bn1.weight``, ``bbox_head.cls_branches.0.bias``), so
the regexes must see the upstream name of each parameter: this is the
inverse of ``rtdetr_checkpoint_conversion``'s table. v1
(``rtdetr_pytorch``) and v2 (``rtdetrv2_pytorch``) name two modules
differently (``encoder.input_proj.N.0``/``.1`` and ``decoder.enc_output.0``
/``.1`` in v1, ``.conv``/``.norm`` and ``.proj``/``.norm`` in v2), which
decides whether upstream's ``norm`` regexes reach them.
"""
import re
from typing import Callable, Dict, List, Tuple

import torch.nn as nn
from mmengine.registry import FUNCTIONS

VERSIONS = (1, 2)
_BRANCH = {'1': 'a', '2': 'b', '3': 'c'}
_STEM_CONV = {'0': '1', '3': '2', '6': '3'}
_STEM_NORM = {'1': '1', '4': '2', '7': '3'}


def _shortcut(stage: str) -> str:
    # PResNet-vd pools then projects in the stride-2 stages
    # ('short.conv' is a ConvNormLayer inside a Sequential).
    return 'short' if stage == '1' else 'short.conv'


def _rules(version: int, num_layers: int) -> List[Tuple[re.Pattern, Callable]]:
    """(pattern on the port's name, upstream name builder)."""
    v1 = version == 1
    table = [
        (r'backbone\.stem\.([036])\.weight',
         lambda m: f'backbone.conv1.conv1_{_STEM_CONV[m[1]]}.conv.weight'),
        (r'backbone\.stem\.([147])\.(.+)',
         lambda m: f'backbone.conv1.conv1_{_STEM_NORM[m[1]]}.norm.{m[2]}'),
        (r'backbone\.layer(\d)\.(\d+)\.conv([123])\.weight',
         lambda m: f'backbone.res_layers.{int(m[1]) - 1}.blocks.{m[2]}.'
         f'branch2{_BRANCH[m[3]]}.conv.weight'),
        (r'backbone\.layer(\d)\.(\d+)\.bn([123])\.(.+)',
         lambda m: f'backbone.res_layers.{int(m[1]) - 1}.blocks.{m[2]}.'
         f'branch2{_BRANCH[m[3]]}.norm.{m[4]}'),
        (r'backbone\.layer(\d)\.(\d+)\.downsample\.1\.weight',
         lambda m: f'backbone.res_layers.{int(m[1]) - 1}.blocks.{m[2]}.'
         f'{_shortcut(m[1])}.conv.weight'),
        (r'backbone\.layer(\d)\.(\d+)\.downsample\.2\.(.+)',
         lambda m: f'backbone.res_layers.{int(m[1]) - 1}.blocks.{m[2]}.'
         f'{_shortcut(m[1])}.norm.{m[3]}'),
        (r'neck\.input_proj\.(\d+)\.0\.(.+)',
         lambda m: f"encoder.input_proj.{m[1]}.{'0' if v1 else 'conv'}.{m[2]}"
         ),
        (r'neck\.input_proj\.(\d+)\.1\.(.+)',
         lambda m: f"encoder.input_proj.{m[1]}.{'1' if v1 else 'norm'}.{m[2]}"
         ),
        (r'neck\.(.+)', lambda m: f'encoder.{m[1]}'),
        (r'input_proj\.(.+)', lambda m: f'decoder.input_proj.{m[1]}'),
        (r'decoder\.layers\.(.+)', lambda m: f'decoder.decoder.layers.{m[1]}'),
        (r'dn_query_generator\.label_embedding\.(.+)',
         lambda m: f'decoder.denoising_class_embed.{m[1]}'),
        (r'query_pos_head\.(.+)', lambda m: f'decoder.query_pos_head.{m[1]}'),
        (r'enc_output\.0\.(.+)',
         lambda m: f"decoder.enc_output.{'0' if v1 else 'proj'}.{m[1]}"),
        (r'enc_output\.1\.(.+)',
         lambda m: f"decoder.enc_output.{'1' if v1 else 'norm'}.{m[1]}"),
        (r'bbox_head\.cls_branches\.(\d+)\.(.+)',
         lambda m: f'decoder.enc_score_head.{m[2]}' if int(m[
             1]) == num_layers else f'decoder.dec_score_head.{m[1]}.{m[2]}'),
        # mmdet reg branch: Linear, ReLU, Linear, ReLU, Linear
        (r'bbox_head\.reg_branches\.(\d+)\.(\d+)\.(.+)',
         lambda m: f'decoder.enc_bbox_head.layers.{int(m[2]) // 2}.{m[3]}'
         if int(m[1]) == num_layers else
         f'decoder.dec_bbox_head.{m[1]}.layers.{int(m[2]) // 2}.{m[3]}'),
    ]
    return [(re.compile(pattern + '$'), build) for pattern, build in table]


def upstream_name(name: str, version: int, num_layers: int) -> str:
    """Upstream's name of the port's parameter or buffer ``name``.

    Raises:
        ValueError: ``version`` is not 1 or 2, or no rule covers ``name``.
    """
    if version not in VERSIONS:
        raise ValueError(f'version must be 1 (rtdetr_pytorch) or 2 '
                         f'(rtdetrv2_pytorch), got {version!r}.')
    for pattern, build in _rules(version, num_layers):
        match = pattern.match(name)
        if match:
            return build(match)
    raise ValueError(f'No upstream RT-DETR name for {name!r}: the port has '
                     'a module upstream does not.')


@FUNCTIONS.register_module()
def rtdetr_upstream_param_names(model: nn.Module,
                                version: int) -> Dict[str, str]:
    """``{port name: upstream name}`` for every parameter of an ``RTDETR``
    model, for ``RegexOptimWrapperConstructor``'s ``param_name_map``.

    Args:
        model (nn.Module): The ``RTDETR`` detector (not wrapped).
        version (int): 1 for ``rtdetr_pytorch``'s names, 2 for
            ``rtdetrv2_pytorch``'s: the YAML the regexes come from.

    Returns:
        dict: Upstream's name of each parameter, by the port's name.
    """
    # the encoder's head is the last branch: one per decoder layer before it
    num_layers = len(model.bbox_head.cls_branches) - 1
    return {
        name: upstream_name(name, version, num_layers)
        for name, _ in model.named_parameters()
    }
