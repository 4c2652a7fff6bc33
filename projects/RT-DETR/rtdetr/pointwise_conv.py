"""1x1 convs on CPU run in oneDNN, forward and backward.

For a 1x1 stride-1 conv torch picks its im2col + GEMM kernel
(``slow_conv2d``) on one thread for a batch under 16 (every rank of a CPU
DDP run has one thread), and for one small image at any thread count
(``ConvParams::use_mkldnn``). On D-FINE-S's 1x1 convs that kernel measured
1.8 times slower than oneDNN's at inference (146 against 82 ms per 640 px
image, one thread) and, with its backward, took 30 % of a training step.
Here the forward is oneDNN's, and so is the backward's input gradient (the
same 1x1 conv with the weight transposed); the weight gradient is one GEMM
per image, as torch's kernel computes it. The values differ from
``F.conv2d``'s by rounding only.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mmddp_ext.utils.torch_private import onednn_conv2d, onednn_runs

# torch's own rule (ConvParams::use_mkldnn): from this batch size on, or
# with more than one thread, it runs a 1x1 conv in oneDNN itself.
TORCH_ONEDNN_BATCH = 16


class _PointwiseConv(torch.autograd.Function):
    """A 1x1 stride-1 conv (no padding, dilation or groups) whose forward
    and input gradient run in oneDNN."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor,
                bias: Optional[Tensor]) -> Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return onednn_conv2d(x, weight, bias, (1, 1), (0, 0), (1, 1), 1)

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = onednn_conv2d(grad,
                                   weight.transpose(0, 1).contiguous(), None,
                                   (1, 1), (0, 0), (1, 1), 1)
        if ctx.needs_input_grad[1]:
            grads = grad.flatten(2)
            inputs = x.flatten(2)
            grad_weight = torch.mm(grads[0], inputs[0].t())
            for image in range(1, grads.shape[0]):
                grad_weight.addmm_(grads[image], inputs[image].t())
            grad_weight = grad_weight.view_as(weight)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad.sum((0, 2, 3))
        return grad_x, grad_weight, grad_bias


def _pointwise(conv: nn.Conv2d) -> bool:
    return (conv.kernel_size == (1, 1) and conv.stride == (1, 1)
            and conv.padding == (0, 0) and conv.dilation == (1, 1)
            and conv.groups == 1 and conv.padding_mode == 'zeros')


def conv2d(x: Tensor, weight: Tensor, bias: Optional[Tensor],
           conv: nn.Conv2d) -> Tensor:
    """``F.conv2d(x, weight, bias)`` with ``conv``'s geometry, a 1x1 conv
    on CPU in oneDNN.

    Differs from ``F.conv2d`` in the kernels only: without gradients every
    1x1 conv runs oneDNN's forward; with gradients, those torch would run
    in its im2col + GEMM kernel (one thread, a batch under 16) run
    :class:`_PointwiseConv`. Anything else (other kernels, dtypes,
    devices) is ``F.conv2d``.
    """
    if _pointwise(conv) and onednn_runs(x, weight):
        if not (torch.is_grad_enabled() and
                (x.requires_grad or weight.requires_grad or
                 (bias is not None and bias.requires_grad))):
            return onednn_conv2d(x, weight, bias, conv.stride, conv.padding,
                                 conv.dilation, conv.groups)
        if (torch.get_num_threads() == 1 and x.shape[0] < TORCH_ONEDNN_BATCH):
            return _PointwiseConv.apply(x, weight, bias)
    return F.conv2d(x, weight, bias, conv.stride, conv.padding, conv.dilation,
                    conv.groups)
