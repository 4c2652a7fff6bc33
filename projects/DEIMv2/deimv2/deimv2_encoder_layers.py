"""Fusion blocks of DEIMv2's encoders (upstream
``engine/deim/hybrid_encoder.py`` and ``lite_encoder.py``).

Plain ``nn.Module`` classes built by :class:`DEIMv2HybridEncoder` and
:class:`LiteEncoder`; attribute names are upstream's, so converted
checkpoints load key for key. The conv + BN layers and RepVGG blocks are
the RT-DETR port's (same names as upstream's ``ConvNormLayer_fuse`` and
``VGGBlock``).
"""
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ports import ConvNormLayer, RepVggBlock


class CSPLayer2(nn.Module):
    """CSP block with one 1x1 projection to twice the hidden width, split
    in halves: RepVGG blocks on the second, added to the first, and a 1x1
    output conv when the hidden width differs (upstream ``CSPLayer2``;
    RT-DETR's ``CSPRepLayer`` has two projections instead).

    Args:
        in_channels (int): Input channels.
        out_channels (int): Output channels.
        num_blocks (int): RepVGG blocks.
        act (str): Activation of every conv. Defaults to 'silu'.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 num_blocks: int,
                 act: str = 'silu') -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(in_channels, 2 * out_channels, 1, act=act)
        self.bottlenecks = nn.Sequential(
            *[RepVggBlock(out_channels, act=act) for _ in range(num_blocks)])
        # expansion is 1 in every DEIMv2 block: no output conv
        self.conv3 = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        kept, refined = self.conv1(x).chunk(2, 1)
        return self.conv3(kept + self.bottlenecks(refined))


class GELANBlock(nn.Module):
    """GELAN fusion block of DEIMv2: a 1x1 conv to ``hidden_channels``
    split in halves; the second half goes through two :class:`CSPLayer2`
    stages, each followed by a 3x3 conv (``with_conv``: upstream
    ``RepNCSPELAN4`` with ``csp_type='csp2'``) or not (upstream
    ``RepNCSPELAN5``); both halves and both stage outputs are concatenated
    and fused by a 1x1 conv.

    Args:
        in_channels (int): Input channels (upstream c1).
        out_channels (int): Output channels (c2).
        hidden_channels (int): Width of the first 1x1 conv (c3).
        branch_channels (int): Width of the two stages (c4).
        num_blocks (int): RepVGG blocks per CSP stage.
        with_conv (bool): A 3x3 conv after each stage. Defaults to True.
        act (str): Activation of every conv. Defaults to 'silu'.
    """

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 hidden_channels: int,
                 branch_channels: int,
                 num_blocks: int,
                 with_conv: bool = True,
                 act: str = 'silu') -> None:
        super().__init__()
        self.half = hidden_channels // 2

        def stage(channels_in: int) -> nn.Sequential:
            layers = [
                CSPLayer2(channels_in, branch_channels, num_blocks, act=act)
            ]
            if with_conv:
                layers.append(
                    ConvNormLayer(
                        branch_channels, branch_channels, 3, act=act))
            return nn.Sequential(*layers)

        self.cv1 = ConvNormLayer(in_channels, hidden_channels, 1, act=act)
        self.cv2 = stage(self.half)
        self.cv3 = stage(branch_channels)
        self.cv4 = ConvNormLayer(
            hidden_channels + 2 * branch_channels, out_channels, 1, act=act)

    def forward(self, x: Tensor) -> Tensor:
        parts = list(self.cv1(x).split((self.half, self.half), 1))
        parts.append(self.cv2(parts[-1]))
        parts.append(self.cv3(parts[-1]))
        return self.cv4(torch.cat(parts, 1))


class GAPFusion(nn.Module):
    """Adds the global average of a map to every position, then a 1x1
    conv + BN + activation (upstream ``GAP_Fusion``).

    Args:
        channels (int): Channels.
        act (str): Activation. Defaults to 'silu'.
    """

    def __init__(self, channels: int, act: str = 'silu') -> None:
        super().__init__()
        self.cv = ConvNormLayer(channels, channels, 1, act=act)

    def forward(self, x: Tensor) -> Tensor:
        return self.cv(x + F.adaptive_avg_pool2d(x, 1))
