"""RT-DETR's hybrid encoder as an MMDetection neck."""
from typing import List, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from .rtdetr_layers import (AIFIEncoder, ConvNormLayer, CSPRepLayer,
                            StaticTensorCache, sincos_pos_embed_2d)


@MODELS.register_module()
class HybridEncoder(BaseModule):
    """Hybrid encoder of RT-DETR: per-level 1x1 projection, AIFI (a
    transformer encoder on the coarsest level only) and CCFM (a top-down
    FPN and a bottom-up PAN of :class:`CSPRepLayer` fusion blocks).

    Module names match upstream's ``HybridEncoder`` (prefix ``encoder.``
    there, ``neck.`` here), so converted checkpoints load 1:1. The AIFI
    position embedding is built once per feature size, device and dtype
    (upstream rebuilds it on every training step and precomputes only
    ``eval_spatial_size``'s).

    Args:
        in_channels (Sequence[int]): Channels of the backbone levels.
            Defaults to (512, 1024, 2048).
        hidden_dim (int): Channels of every output level. Defaults to 256.
        num_heads (int): Attention heads of the AIFI layers. Defaults to 8.
        feedforward_channels (int): FFN width of the AIFI layers. Defaults
            to 1024.
        dropout (float): Dropout of the AIFI layers. Defaults to 0.0.
        enc_act (str): FFN activation of the AIFI layers. Defaults to
            'gelu'.
        use_encoder_idx (Sequence[int]): Levels that get an AIFI encoder.
            Defaults to (2, ).
        num_encoder_layers (int): AIFI layers per encoded level. Defaults
            to 1.
        pe_temperature (float): Temperature of the sin-cos position
            embedding. Defaults to 10000.
        expansion (float): Hidden width ratio of the CSP blocks (0.5 for
            r18vd/r34vd, 1.0 for r50vd/r101vd). Defaults to 1.0.
        depth_mult (float): Multiplies the 3 RepVGG blocks per CSP block.
            Defaults to 1.0.
        act (str): Activation of the CCFM convolutions. Defaults to 'silu'.
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
        super().__init__(init_cfg=init_cfg)
        num_levels = len(in_channels)
        bad = [i for i in use_encoder_idx if not 0 <= i < num_levels]
        if bad:
            raise ValueError(
                f'{type(self).__name__} use_encoder_idx must index the '
                f'{num_levels} levels of in_channels, but got '
                f'{list(use_encoder_idx)}.')
        self.in_channels = list(in_channels)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = list(use_encoder_idx)
        self.num_encoder_layers = num_encoder_layers
        self.pe_temperature = pe_temperature
        self.expansion = expansion
        self.depth_mult = depth_mult
        self.act = act
        # position embeddings per (width, height, device, dtype)
        self.pos_embed_cache = StaticTensorCache()
        self.input_proj = nn.ModuleList(
            self._build_input_proj(channels) for channels in in_channels)
        self.encoder = nn.ModuleList(
            AIFIEncoder(
                num_encoder_layers,
                embed_dims=hidden_dim,
                num_heads=num_heads,
                feedforward_channels=feedforward_channels,
                dropout=dropout,
                act=enc_act) for _ in self.use_encoder_idx)
        # built in this order (parameter init draws follow it)
        steps = range(num_levels - 1)
        self.lateral_convs = nn.ModuleList(self._build_lateral_conv()
                                           for _ in steps)
        self.fpn_blocks = nn.ModuleList(self._build_fusion_block()
                                        for _ in steps)
        self.downsample_convs = nn.ModuleList(self._build_downsample_conv()
                                              for _ in steps)
        self.pan_blocks = nn.ModuleList(self._build_fusion_block()
                                        for _ in steps)

    # Builders of the per-level modules: the seams a model on this encoder
    # (D-FINE's DFINEHybridEncoder) overrides. They read the constructor's
    # keys from ``self``; the module each returns keeps its upstream name.

    def _build_input_proj(self, in_channels: int) -> nn.Module:
        """1x1 conv + BN from one backbone level to ``hidden_dim``
        (upstream keys ``input_proj.i.0`` / ``.1``)."""
        return nn.Sequential(
            nn.Conv2d(in_channels, self.hidden_dim, 1, bias=False),
            nn.BatchNorm2d(self.hidden_dim))

    def _build_lateral_conv(self) -> nn.Module:
        """1x1 conv-BN-``act`` of the top-down path."""
        return ConvNormLayer(self.hidden_dim, self.hidden_dim, 1, act=self.act)

    def _build_fusion_block(self) -> nn.Module:
        """Fusion of two concatenated levels (an FPN and a PAN block):
        :class:`CSPRepLayer` with ``round(3 * depth_mult)`` RepVGG
        blocks."""
        return CSPRepLayer(
            self.hidden_dim * 2,
            self.hidden_dim,
            round(3 * self.depth_mult),
            expansion=self.expansion,
            act=self.act)

    def _build_downsample_conv(self) -> nn.Module:
        """Stride-2 3x3 conv-BN-``act`` of the bottom-up path."""
        return ConvNormLayer(
            self.hidden_dim, self.hidden_dim, 3, 2, act=self.act)

    def forward(self, feats: Sequence[Tensor]) -> Tuple[Tensor]:
        """Fuse the backbone levels.

        Args:
            feats (Sequence[Tensor]): Backbone features, fine to coarse,
                each (bs, in_channels[i], H_i, W_i).

        Returns:
            tuple[Tensor]: One (bs, hidden_dim, H_i, W_i) map per level.
        """
        if len(feats) != len(self.in_channels):
            raise ValueError(
                f'HybridEncoder got {len(feats)} feature levels but its '
                f'in_channels has {len(self.in_channels)}. Make the '
                'backbone out_indices match neck.in_channels.')
        proj = [layer(x) for layer, x in zip(self.input_proj, feats)]
        for encoder, level in zip(self.encoder, self.use_encoder_idx):
            proj[level] = self._encode_level(encoder, proj[level])
        return self._fuse(proj)

    def _encode_level(self, encoder: nn.Module, feat: Tensor) -> Tensor:
        """AIFI on one level; returns the map in its input layout."""
        bs, channels, height, width = feat.shape
        tokens = feat.flatten(2).transpose(1, 2)
        pos = self.pos_embed_cache.get(
            (width, height, tokens.device, tokens.dtype),
            lambda: sincos_pos_embed_2d(width, height, channels, self.
                                        pe_temperature).to(tokens))
        tokens = encoder(tokens, pos)
        return tokens.transpose(1, 2).reshape(bs, channels, height,
                                              width).contiguous()

    def _fuse(self, proj: List[Tensor]) -> Tuple[Tensor]:
        """CCFM: top-down FPN, then bottom-up PAN."""
        num_levels = len(proj)
        inner = [proj[-1]]
        for step, level in enumerate(range(num_levels - 1, 0, -1)):
            high = self.lateral_convs[step](inner[0])
            inner[0] = high
            low = proj[level - 1]
            if low.shape[-2:] == tuple(2 * s for s in high.shape[-2:]):
                up = F.interpolate(high, scale_factor=2., mode='nearest')
            else:  # odd input sizes: upstream falls back to bilinear
                up = F.interpolate(high, size=low.shape[-2:], mode='bilinear')
            inner.insert(0, self.fpn_blocks[step](torch.cat([up, low], 1)))
        outs = [inner[0]]
        for step in range(num_levels - 1):
            down = self.downsample_convs[step](outs[-1])
            outs.append(self.pan_blocks[step](torch.cat(
                [down, inner[step + 1]], 1)))
        return tuple(outs)
