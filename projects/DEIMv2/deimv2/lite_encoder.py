"""DEIMv2's light encoder (Atto, Femto, Pico) as an MMDetection neck."""
from collections import OrderedDict
from typing import Sequence, Tuple

import torch.nn.functional as F
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from .deimv2_encoder_layers import GAPFusion, GELANBlock
from .ports import build_activation


@MODELS.register_module()
class DEIMv2LiteEncoder(BaseModule):
    """Upstream ``LiteEncoder``: one stride-16 backbone level in, two
    levels (strides 16 and 32) out, with no attention.

    The level is projected to ``hidden_dim`` (1x1 conv + BN); a stride-32
    level is made from it (3x3 average pooling with stride 2, 1x1 conv,
    BN, activation: ``down_sample1``) and mixed with its global average
    (:class:`GAPFusion`). One FPN step adds the upsampled stride-32 map
    to the stride-16 map (``fpn_block``), one PAN step adds the
    downsampled result (``down_sample2``) to the stride-32 map
    (``pan_block``); both blocks are :class:`GELANBlock` with 3x3 convs.

    Args:
        in_channels (Sequence[int]): Channels of the one backbone level.
            Defaults to (512, ).
        hidden_dim (int): Channels of both outputs. Defaults to 256.
        expansion (float): Branch width ratio of the fusion blocks
            (``round(expansion * hidden_dim // 2)``). Defaults to 1.0.
        depth_mult (float): Multiplies the 3 RepVGG blocks per CSP stage.
            Defaults to 1.0.
        act (str): Activation. Defaults to 'silu'.
        init_cfg (dict, optional): MMEngine init config. Defaults to None.
    """

    def __init__(self,
                 in_channels: Sequence[int] = (512, ),
                 hidden_dim: int = 256,
                 expansion: float = 1.0,
                 depth_mult: float = 1.0,
                 act: str = 'silu',
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if len(in_channels) != 1:
            raise ValueError(
                'DEIMv2LiteEncoder takes one backbone level (stride 16), '
                f'but in_channels is {list(in_channels)}. Set the '
                'backbone out_indices to one stage (Atto/Femto/Pico: (2, )) '
                'and in_channels to its width.')
        self.in_channels = list(in_channels)
        self.hidden_dim = hidden_dim
        self.input_proj = nn.ModuleList([
            nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(in_channels[0], hidden_dim, 1, bias=False),
                    norm=nn.BatchNorm2d(hidden_dim)))
        ])

        def down_sample() -> nn.Sequential:
            return nn.Sequential(
                nn.AvgPool2d(kernel_size=3, stride=2, padding=1),
                nn.Conv2d(hidden_dim, hidden_dim, 1, 1, bias=False),
                nn.BatchNorm2d(hidden_dim), build_activation(act))

        def fuse_block() -> GELANBlock:
            return GELANBlock(
                hidden_dim,
                hidden_dim,
                hidden_dim * 2,
                round(expansion * hidden_dim // 2),
                round(3 * depth_mult),
                with_conv=True,
                act=act)

        self.down_sample1 = down_sample()
        self.down_sample2 = down_sample()
        self.bi_fusion = GAPFusion(hidden_dim, act=act)
        self.fpn_block = fuse_block()
        self.pan_block = fuse_block()

    def forward(self, feats: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
        """Stride-16 and stride-32 maps, each (bs, hidden_dim, H, W)."""
        if len(feats) != 1:
            raise ValueError(
                f'DEIMv2LiteEncoder got {len(feats)} feature levels but '
                'takes one; set the backbone out_indices to one stage.')
        fine = self.input_proj[0](feats[0])
        coarse = self.bi_fusion(self.down_sample1(fine))
        fine = self.fpn_block(fine +
                              F.interpolate(coarse, size=fine.shape[-2:]))
        coarse = self.pan_block(coarse + self.down_sample2(fine))
        return fine, coarse
