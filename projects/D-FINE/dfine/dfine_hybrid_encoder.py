"""D-FINE's hybrid encoder as an MMDetection neck."""
from collections import OrderedDict
from typing import Sequence

from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import nn

from .dfine_encoder_layers import RepNCSPELAN4, SCDown
from .rtdetr_port import (AIFIEncoder, ConvNormLayer, HybridEncoder,
                          StaticTensorCache)


@MODELS.register_module()
class DFINEHybridEncoder(HybridEncoder):
    """Hybrid encoder of D-FINE: RT-DETR's (:class:`HybridEncoder`: 1x1
    projections, AIFI on the coarsest level, top-down FPN and bottom-up
    PAN) with lighter fusion layers.

    Differs from ``HybridEncoder.__init__`` only in the modules it builds
    (``forward`` is RT-DETR's):

    - ``input_proj[i]`` is named ``conv`` / ``norm`` as upstream;
    - ``lateral_convs`` are 1x1 conv + BN without activation;
    - ``fpn_blocks`` / ``pan_blocks`` are :class:`RepNCSPELAN4` (hidden
      width ``2 * hidden_dim``, branch width ``round(expansion *
      hidden_dim // 2)``, ``round(3 * depth_mult)`` RepVGG blocks);
    - ``downsample_convs`` are :class:`SCDown` (1x1 conv, then a
      depth-wise stride-2 3x3 conv, no activation).

    Module names are upstream's (prefix ``encoder.`` there, ``neck.``
    here), so converted checkpoints load key for key.

    Args:
        in_channels (Sequence[int]): Channels of the backbone levels.
            Defaults to (512, 1024, 2048).
        hidden_dim (int): Channels of every output level. Defaults to 256.
        num_heads (int): Attention heads of the AIFI layers (upstream
            ``nhead``). Defaults to 8.
        feedforward_channels (int): FFN width of the AIFI layers (upstream
            ``dim_feedforward``). Defaults to 1024.
        dropout (float): Dropout of the AIFI layers. Defaults to 0.0.
        enc_act (str): FFN activation of the AIFI layers. Defaults to
            'gelu'.
        use_encoder_idx (Sequence[int]): Levels that get an AIFI encoder.
            Defaults to (2, ).
        num_encoder_layers (int): AIFI layers per encoded level. Defaults
            to 1.
        pe_temperature (float): Temperature of the sin-cos position
            embedding. Defaults to 10000.
        expansion (float): Branch width ratio of the fusion blocks (0.34
            for N, 0.5 for S, 1.0 otherwise). Defaults to 1.0.
        depth_mult (float): Multiplies the 3 RepVGG blocks per CSP block
            (0.5 for N, 0.34 for S, 0.67 for M). Defaults to 1.0.
        act (str): Activation of the fusion blocks. Defaults to 'silu'.
        init_cfg (dict, optional): MMEngine init config. Defaults to None.
    """

    def __init__(self,
                 in_channels: Sequence[int] = (512, 1024, 2048),
                 hidden_dim: int = 256,
                 num_heads: int = 8,
                 feedforward_channels: int = 1024,
                 dropout: float = 0.0,
                 enc_act: str = 'gelu',
                 use_encoder_idx: Sequence[int] = (2, ),
                 num_encoder_layers: int = 1,
                 pe_temperature: float = 10000.,
                 expansion: float = 1.0,
                 depth_mult: float = 1.0,
                 act: str = 'silu',
                 init_cfg=None) -> None:
        # RT-DETR's __init__ would build its own fusion layers first.
        BaseModule.__init__(self, init_cfg=init_cfg)
        num_levels = len(in_channels)
        bad = [i for i in use_encoder_idx if not 0 <= i < num_levels]
        if bad:
            raise ValueError(
                'DFINEHybridEncoder use_encoder_idx must index the '
                f'{num_levels} levels of in_channels, but got '
                f'{list(use_encoder_idx)}.')
        self.in_channels = list(in_channels)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = list(use_encoder_idx)
        self.num_encoder_layers = num_encoder_layers
        self.pe_temperature = pe_temperature
        self.pos_embed_cache = StaticTensorCache()
        self.input_proj = nn.ModuleList(
            nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(channels, hidden_dim, 1, bias=False),
                    norm=nn.BatchNorm2d(hidden_dim)))
            for channels in in_channels)
        self.encoder = nn.ModuleList(
            AIFIEncoder(
                num_encoder_layers,
                embed_dims=hidden_dim,
                num_heads=num_heads,
                feedforward_channels=feedforward_channels,
                dropout=dropout,
                act=enc_act) for _ in self.use_encoder_idx)

        def fusion_block():
            return RepNCSPELAN4(
                hidden_dim * 2,
                hidden_dim,
                hidden_dim * 2,
                round(expansion * hidden_dim // 2),
                round(3 * depth_mult),
                act=act)

        self.lateral_convs = nn.ModuleList(
            ConvNormLayer(hidden_dim, hidden_dim, 1)
            for _ in range(num_levels - 1))
        self.fpn_blocks = nn.ModuleList(fusion_block()
                                        for _ in range(num_levels - 1))
        self.downsample_convs = nn.ModuleList(
            nn.Sequential(SCDown(hidden_dim, hidden_dim, 3, 2))
            for _ in range(num_levels - 1))
        self.pan_blocks = nn.ModuleList(fusion_block()
                                        for _ in range(num_levels - 1))
