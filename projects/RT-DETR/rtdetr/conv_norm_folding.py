"""Conv + BatchNorm run as one conv at inference.

With its running statistics, a BatchNorm after a conv is an affine map per
output channel, so ``norm(conv(x))`` equals one conv whose weight is
scaled per output channel and which has a bias. Upstream RT-DETR and
D-FINE fold this way only in their export path (``convert_to_deploy``);
here every inference forward does (validation, test, ``predict``), which
removes one pass over each activation map and, in a RepVGG block, the
whole 1x1 branch.

The folded weights are cached on the module, keyed by the identity,
storage, device, dtype and version counter of every tensor they are made
from, so an optimizer step, an EMA update, ``load_state_dict`` or a move
to another device or dtype (anything that writes or replaces one of them)
refolds on the next call. A module in training mode, or a forward that
records gradients, runs conv and norm as they are and drops the cache
(no folded copy of the weights is held while training).
"""
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmddp_ext.utils.torch_private import BatchNormBase, cached_until_written
from .pointwise_conv import conv2d

Folded = Tuple[Tensor, Tensor]
# the attribute of the owning module that holds (key, folded weights),
# see torch_private.cached_until_written
CACHE = '_folded_cache'


def folds(conv: nn.Module, norm: nn.Module) -> bool:
    """Whether ``norm(conv(x))`` may run as one folded conv now: no
    gradients recorded, a zero-padded ``nn.Conv2d`` and a BatchNorm in
    eval mode with running statistics."""
    return (not torch.is_grad_enabled() and type(conv) is nn.Conv2d
            and conv.padding_mode == 'zeros'
            and isinstance(norm, BatchNormBase) and not norm.training
            and norm.running_mean is not None and norm.affine)


def fold(conv: nn.Conv2d, norm: nn.Module) -> Folded:
    """Weight and bias of the conv equal to ``norm(conv(x))`` with the
    norm's running statistics."""
    scale = norm.weight * torch.rsqrt(norm.running_var + norm.eps)
    weight = conv.weight * scale.reshape(-1, 1, 1, 1)
    bias = norm.bias - norm.running_mean * scale
    if conv.bias is not None:
        bias = bias + conv.bias * scale
    return weight, bias


def _sources(conv: nn.Conv2d, norm: nn.Module) -> list:
    return [
        conv.weight, conv.bias, norm.weight, norm.bias, norm.running_mean,
        norm.running_var
    ]


def conv_norm(owner: nn.Module, conv: nn.Conv2d, norm: nn.Module,
              x: Tensor) -> Tensor:
    """``norm(conv(x))``, as one folded conv when :func:`folds`; the conv
    runs through :func:`~.pointwise_conv.conv2d` (a 1x1 one in oneDNN)."""
    if not folds(conv, norm):
        owner.__dict__.pop(CACHE, None)
        if type(conv) is not nn.Conv2d:
            return norm(conv(x))
        return norm(conv2d(x, conv.weight, conv.bias, conv))
    weight, bias = cached_until_written(owner, CACHE, _sources(conv, norm),
                                        lambda: fold(conv, norm))
    return conv2d(x, weight, bias, conv)


def two_branch_conv_norm(owner: nn.Module, branch3x3: Tuple[nn.Conv2d,
                                                            nn.Module],
                         branch1x1: Tuple[nn.Conv2d, nn.Module],
                         x: Tensor) -> Optional[Tensor]:
    """``norm3(conv3(x)) + norm1(conv1(x))`` of a RepVGG block as one 3x3
    conv (the 1x1 kernel sits at the centre of the 3x3 one), or None when
    either branch does not :func:`folds`."""
    (conv3, norm3), (conv1, norm1) = branch3x3, branch1x1
    if not (folds(conv3, norm3) and folds(conv1, norm1)
            and conv3.stride == conv1.stride == (1, 1)
            and conv3.dilation == conv1.dilation == (1, 1)
            and conv3.kernel_size == (3, 3) and conv1.kernel_size == (1, 1)
            and conv3.padding == (1, 1) and conv1.padding == (0, 0)
            and conv3.groups == conv1.groups == 1):
        owner.__dict__.pop(CACHE, None)
        return None

    def make() -> Folded:
        weight3, bias3 = fold(conv3, norm3)
        weight1, bias1 = fold(conv1, norm1)
        return weight3 + F.pad(weight1, (1, 1, 1, 1)), bias3 + bias1

    weight, bias = cached_until_written(
        owner, CACHE,
        _sources(conv3, norm3) + _sources(conv1, norm1), make)
    return F.conv2d(x, weight, bias, 1, 1)
