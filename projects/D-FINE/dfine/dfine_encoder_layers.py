"""Blocks of D-FINE's hybrid encoder that RT-DETR's has not: the
GELAN-style fusion block and the separable downsampling conv. Names are
upstream's (``cv1`` ... ``cv4``), so checkpoints load key for key.
"""
import torch
from torch import Tensor, nn

from .ports import ConvNormLayer, CSPRepLayer


class GroupedConvNormLayer(ConvNormLayer):
    """:class:`ConvNormLayer` (conv, BN, activation; 'same' padding) whose
    conv has ``groups`` groups (upstream ``ConvNormLayer_fuse`` with
    ``g``)."""

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int,
                 stride: int = 1,
                 groups: int = 1,
                 act=None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, act)
        if groups != 1:
            self.conv = nn.Conv2d(
                in_channels,
                out_channels,
                kernel_size,
                stride,
                padding=(kernel_size - 1) // 2,
                groups=groups,
                bias=False)


class RepNCSPELAN4(nn.Module):
    """GELAN fusion block (upstream ``RepNCSPELAN4``): a 1x1 conv to
    ``hidden_channels`` split in two halves; the second half goes through
    two stages of (CSP block of RepVGG blocks, 3x3 conv), and the two
    halves and both stage outputs are concatenated and fused by a 1x1 conv.

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
        hidden_channels (int): Width of the first 1x1 conv (upstream c3).
        branch_channels (int): Width of the two stages (upstream c4).
        num_blocks (int): RepVGG blocks per CSP block.
        act (str): Activation of every conv. Defaults to 'silu'.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 hidden_channels: int,
                 branch_channels: int,
                 num_blocks: int,
                 act: str = 'silu') -> None:
        super().__init__()
        self.half = hidden_channels // 2
        self.cv1 = ConvNormLayer(in_channels, hidden_channels, 1, act=act)
        self.cv2 = nn.Sequential(
            CSPRepLayer(self.half, branch_channels, num_blocks, act=act),
            ConvNormLayer(branch_channels, branch_channels, 3, act=act))
        self.cv3 = nn.Sequential(
            CSPRepLayer(branch_channels, branch_channels, num_blocks, act=act),
            ConvNormLayer(branch_channels, branch_channels, 3, act=act))
        self.cv4 = ConvNormLayer(
            hidden_channels + 2 * branch_channels, out_channels, 1, act=act)

    def forward(self, x: Tensor) -> Tensor:
        parts = list(self.cv1(x).split((self.half, self.half), 1))
        parts.append(self.cv2(parts[-1]))
        parts.append(self.cv3(parts[-1]))
        return self.cv4(torch.cat(parts, 1))


class SCDown(nn.Module):
    """Separable downsampling: a 1x1 conv, then a depth-wise ``kernel_size``
    conv with ``stride``; BN after each, no activation (upstream
    ``SCDown``)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int,
                 stride: int) -> None:
        super().__init__()
        self.cv1 = ConvNormLayer(in_channels, out_channels, 1)
        self.cv2 = GroupedConvNormLayer(
            out_channels,
            out_channels,
            kernel_size,
            stride,
            groups=out_channels)

    def forward(self, x: Tensor) -> Tensor:
        return self.cv2(self.cv1(x))
