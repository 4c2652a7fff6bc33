"""Building blocks of HGNetv2 (PaddleDetection's PP-HGNetV2, as D-FINE
uses it). Plain ``nn.Module`` classes, built by :class:`HGNetv2`; their
attribute names are upstream's, so checkpoints load key for key.
"""
from typing import List

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ports import conv_norm


class LearnableAffineBlock(nn.Module):
    """``scale * x + bias`` with two learned scalars (``lab``)."""

    def __init__(self,
                 scale_value: float = 1.0,
                 bias_value: float = 0.0) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([scale_value]))
        self.bias = nn.Parameter(torch.tensor([bias_value]))

    def forward(self, x: Tensor) -> Tensor:
        return self.scale * x + self.bias


class ConvBNAct(nn.Module):
    """Conv2d (no bias, padding ``(k - 1) // 2``) + BatchNorm2d, then ReLU
    and a :class:`LearnableAffineBlock` when ``use_act`` (the block only
    with ``use_lab``)."""

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int,
                 stride: int = 1,
                 groups: int = 1,
                 use_act: bool = True,
                 use_lab: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding=(kernel_size - 1) // 2,
            groups=groups,
            bias=False)
        self.bn = nn.BatchNorm2d(out_channels)
        # in place: its input is the norm's fresh output (upstream: not)
        self.act = nn.ReLU(inplace=True) if use_act else nn.Identity()
        self.lab = (
            LearnableAffineBlock() if use_act and use_lab else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        # differs from upstream: at inference conv and bn run as one folded
        # conv (RT-DETR's conv_norm_folding; same values up to rounding)
        return self.lab(self.act(conv_norm(self, self.conv, self.bn, x)))


class LightConvBNAct(nn.Module):
    """A 1x1 :class:`ConvBNAct` without activation, then a depth-wise
    ``kernel_size`` one with it."""

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int,
                 use_lab: bool = False) -> None:
        super().__init__()
        self.conv1 = ConvBNAct(
            in_channels, out_channels, 1, use_act=False, use_lab=use_lab)
        self.conv2 = ConvBNAct(
            out_channels,
            out_channels,
            kernel_size,
            groups=out_channels,
            use_lab=use_lab)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv2(self.conv1(x))


class StemBlock(nn.Module):
    """Stride-4 stem: a stride-2 3x3 conv, then two branches (a 2x2 max
    pool and two 2x2 convs, each input padded by one pixel right and
    below) concatenated, a stride-2 3x3 conv and a 1x1 conv."""

    def __init__(self,
                 in_channels: int,
                 mid_channels: int,
                 out_channels: int,
                 use_lab: bool = False) -> None:
        super().__init__()
        self.stem1 = ConvBNAct(
            in_channels, mid_channels, 3, stride=2, use_lab=use_lab)
        self.stem2a = ConvBNAct(
            mid_channels, mid_channels // 2, 2, use_lab=use_lab)
        self.stem2b = ConvBNAct(
            mid_channels // 2, mid_channels, 2, use_lab=use_lab)
        self.stem3 = ConvBNAct(
            mid_channels * 2, mid_channels, 3, stride=2, use_lab=use_lab)
        self.stem4 = ConvBNAct(mid_channels, out_channels, 1, use_lab=use_lab)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=1, ceil_mode=True)

    def forward(self, x: Tensor) -> Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))
        branch = self.stem2b(F.pad(self.stem2a(x), (0, 1, 0, 1)))
        x = torch.cat([self.pool(x), branch], dim=1)
        return self.stem4(self.stem3(x))


class HGBlock(nn.Module):
    """HG block: ``num_layers`` convs in a chain (plain 3x3 or light
    depth-wise ones), the block input and every conv output concatenated,
    then a squeeze (1x1 to ``out_channels // 2``) and an excitation (1x1
    to ``out_channels``) conv (``aggregation``); a residual connection for
    every block of a stage but the first. Upstream: ``HG_Block`` with
    ``agg='se'``, the aggregation HGNetv2 builds."""

    def __init__(self,
                 in_channels: int,
                 mid_channels: int,
                 out_channels: int,
                 num_layers: int,
                 kernel_size: int = 3,
                 residual: bool = False,
                 light_block: bool = False,
                 use_lab: bool = False) -> None:
        super().__init__()
        self.residual = residual
        layers: List[nn.Module] = []
        for i in range(num_layers):
            channels = in_channels if i == 0 else mid_channels
            if light_block:
                layers.append(
                    LightConvBNAct(
                        channels, mid_channels, kernel_size, use_lab=use_lab))
            else:
                layers.append(
                    ConvBNAct(
                        channels, mid_channels, kernel_size, use_lab=use_lab))
        self.layers = nn.ModuleList(layers)
        total_channels = in_channels + num_layers * mid_channels
        self.aggregation = nn.Sequential(
            ConvBNAct(total_channels, out_channels // 2, 1, use_lab=use_lab),
            ConvBNAct(out_channels // 2, out_channels, 1, use_lab=use_lab))

    def forward(self, x: Tensor) -> Tensor:
        outputs = [x]
        for layer in self.layers:
            outputs.append(layer(outputs[-1]))
        y = self.aggregation(torch.cat(outputs, dim=1))
        return y + x if self.residual else y


class HGStage(nn.Module):
    """A stride-2 depth-wise 3x3 conv without activation (when
    ``downsample``, else nothing), then ``num_blocks`` :class:`HGBlock`
    (upstream ``HG_Stage``)."""

    def __init__(self,
                 in_channels: int,
                 mid_channels: int,
                 out_channels: int,
                 num_blocks: int,
                 num_layers: int,
                 downsample: bool = True,
                 light_block: bool = False,
                 kernel_size: int = 3,
                 use_lab: bool = False) -> None:
        super().__init__()
        self.downsample = (
            ConvBNAct(
                in_channels,
                in_channels,
                3,
                stride=2,
                groups=in_channels,
                use_act=False,
                use_lab=use_lab) if downsample else nn.Identity())
        self.blocks = nn.Sequential(*[
            HGBlock(
                in_channels if i == 0 else out_channels,
                mid_channels,
                out_channels,
                num_layers,
                kernel_size=kernel_size,
                residual=i > 0,
                light_block=light_block,
                use_lab=use_lab) for i in range(num_blocks)
        ])

    def forward(self, x: Tensor) -> Tensor:
        return self.blocks(self.downsample(x))
