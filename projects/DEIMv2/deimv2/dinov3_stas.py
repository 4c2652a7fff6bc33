"""DEIMv2's DINOv3 backbones: a ViT and the Spatial Tuning Adapter (STA)
that turns its single-scale tokens into three scales."""
import copy
from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmcv.cnn import build_norm_layer
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from .dinov3_vit import ViT

# Upstream's names -> ViT keys. dinov3_vits16 / dinov3_vits16plus are
# DINOv3's (engine/backbone/dinov3/vision_transformer.py configs);
# vit_tiny / vit_tinyplus are DEIMv2's distilled ViTs, whose width and
# heads upstream takes from the YAML (embed_dim, num_heads).
_DINOV3 = dict(
    embed_dims=384,
    num_heads=6,
    ffn_ratio=4.0,
    ffn_type='mlp',
    num_storage_tokens=4,
    layerscale=1e-5,
    mask_k_bias=True,
    norm_eps=1e-5,
    final_norm=True,
    with_mask_token=True,
    rope_rescale=2.0)
VIT_PRESETS = {
    'dinov3_vits16': _DINOV3,
    'dinov3_vits16plus': dict(_DINOV3, ffn_type='swiglu', ffn_ratio=6.0),
    'vit_tiny': dict(embed_dims=192, num_heads=3),
    'vit_tinyplus': dict(embed_dims=256, num_heads=4),
}
# upstream reshapes the tokens on a stride-16 grid whatever the patch
TOKEN_STRIDE = 16


class SpatialTuningAdapter(nn.Module):
    """Upstream ``SpatialPriorModulev2``: a small CNN giving detail maps at
    strides 8, 16 and 32 (``2 c``, ``4 c`` and ``4 c`` channels for
    ``c = inplanes``).

    Args:
        inplanes (int): ``c`` above (upstream ``conv_inplane``).
        norm_cfg (dict): Norm layers (upstream: SyncBatchNorm).
    """

    def __init__(self, inplanes: int, norm_cfg: dict) -> None:
        super().__init__()

        def conv(c_in: int, c_out: int) -> nn.Conv2d:
            return nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False)

        def norm(channels: int) -> nn.Module:
            return build_norm_layer(norm_cfg, channels)[1]

        self.stem = nn.Sequential(
            conv(3, inplanes), norm(inplanes), nn.GELU(),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1))
        self.conv2 = nn.Sequential(
            conv(inplanes, 2 * inplanes), norm(2 * inplanes))
        self.conv3 = nn.Sequential(nn.GELU(), conv(2 * inplanes, 4 * inplanes),
                                   norm(4 * inplanes))
        self.conv4 = nn.Sequential(nn.GELU(), conv(4 * inplanes, 4 * inplanes),
                                   norm(4 * inplanes))

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        c2 = self.conv2(self.stem(x))
        c3 = self.conv3(c2)
        return c2, c3, self.conv4(c3)


@MODELS.register_module()
class DINOv3STAs(BaseModule):
    """Upstream ``DINOv3STAs``: a ViT's patch tokens of three blocks,
    reshaped to the stride-16 grid and resized bilinearly to strides 8,
    16 and 32, each concatenated with the STA's detail map of that stride,
    projected to ``hidden_dim`` (1x1 conv) and normalised.

    Module names are upstream's: ``dinov3`` (DINOv3 ViT-S / S+) or
    ``dinov3._model`` (the distilled ViT-Tiny / Tiny+), ``sta``,
    ``convs``, ``norms``.

    Args:
        name (str): 'vit_tiny' (DEIMv2-S), 'vit_tinyplus' (M),
            'dinov3_vits16' (L) or 'dinov3_vits16plus' (X).
        interaction_indexes (Sequence[int]): The three blocks used
            ([3, 7, 11] for the tiny ViTs, [5, 8, 11] for DINOv3).
        embed_dim (int, optional): Token width of the tiny ViTs (upstream
            ``embed_dim``); None for the preset. Defaults to None.
        num_heads (int, optional): Heads of the tiny ViTs; None for the
            preset. Defaults to None.
        finetune (bool): Train the ViT; False freezes it (and keeps it in
            eval mode). Defaults to True.
        conv_inplane (int): STA width ``c``. Defaults to 16.
        hidden_dim (int, optional): Output channels; None for the ViT's
            width. Defaults to None.
        use_sta (bool): Concatenate the STA's detail maps. Defaults to
            True.
        norm_cfg (dict): Norm of the STA and the outputs. Upstream builds
            SyncBatchNorm; here BN, which the recipe's ``sync_bn='torch'``
            (upstream ``sync_bn: True``) converts in multi-GPU runs.
            Defaults to ``dict(type='BN')``.
        vit_init_cfg (dict, optional): Init config of the ViT alone, e.g.
            ``dict(type='Pretrained', checkpoint='vitt_distill.pt')``:
            upstream's backbone files (``weights_path``) hold the ViT's
            keys. Defaults to None.
        init_cfg (dict, optional): MMEngine init config. Defaults to None.
    """

    def __init__(self,
                 name: str,
                 interaction_indexes: Sequence[int],
                 embed_dim: Optional[int] = None,
                 num_heads: Optional[int] = None,
                 finetune: bool = True,
                 conv_inplane: int = 16,
                 hidden_dim: Optional[int] = None,
                 use_sta: bool = True,
                 norm_cfg: dict = dict(type='BN'),
                 vit_init_cfg: Optional[dict] = None,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if name not in VIT_PRESETS:
            raise ValueError(
                f'DINOv3STAs name must be one of {sorted(VIT_PRESETS)}, but '
                f'got {name!r}. DEIMv2-S uses vit_tiny, M vit_tinyplus, L '
                'dinov3_vits16, X dinov3_vits16plus.')
        if len(interaction_indexes) != 3:
            raise ValueError(
                'DINOv3STAs interaction_indexes must name three ViT blocks '
                '(strides 8, 16, 32), but got '
                f'{list(interaction_indexes)}.')
        vit_cfg = copy.deepcopy(VIT_PRESETS[name])
        is_dinov3 = name.startswith('dinov3')
        if not is_dinov3:
            if embed_dim is not None:
                vit_cfg['embed_dims'] = embed_dim
            if num_heads is not None:
                vit_cfg['num_heads'] = num_heads
        vit = ViT(
            **vit_cfg, out_indices=interaction_indexes, init_cfg=vit_init_cfg)
        if is_dinov3:
            self.dinov3 = vit
        else:
            self.dinov3 = nn.Module()
            self.dinov3._model = vit
        self.finetune = finetune
        if not finetune:
            vit.requires_grad_(False)
        embed_dims = vit.embed_dims
        self.use_sta = use_sta
        detail = (2 * conv_inplane, 4 * conv_inplane, 4 * conv_inplane)
        if use_sta:
            self.sta = SpatialTuningAdapter(conv_inplane, norm_cfg)
        else:
            detail = (0, 0, 0)
        hidden_dim = hidden_dim or embed_dims
        self.out_channels = [hidden_dim] * 3
        self.convs = nn.ModuleList(
            nn.Conv2d(embed_dims + c, hidden_dim, 1, bias=False)
            for c in detail)
        self.norms = nn.ModuleList(
            build_norm_layer(norm_cfg, hidden_dim)[1] for _ in range(3))

    @property
    def vit(self) -> ViT:
        """The ViT, under upstream's name for it."""
        if isinstance(self.dinov3, ViT):
            return self.dinov3
        return self.dinov3._model

    def train(self, mode: bool = True) -> 'DINOv3STAs':
        """Set the mode; a frozen ViT (``finetune=False``) stays in
        eval."""
        super().train(mode)
        if not self.finetune:
            self.vit.eval()
        return self

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Maps at strides 8, 16, 32, each (bs, hidden_dim, H, W)."""
        if x.shape[-2] % TOKEN_STRIDE or x.shape[-1] % TOKEN_STRIDE:
            raise ValueError(
                f'DINOv3STAs needs inputs whose sides are multiples of '
                f'{TOKEN_STRIDE}, but got {tuple(x.shape[-2:])}. Set '
                'data_preprocessor.pad_size_divisor to 32.')
        height = x.shape[-2] // TOKEN_STRIDE
        width = x.shape[-1] // TOKEN_STRIDE
        layers = self.vit(x)
        fused = []
        details = self.sta(x) if self.use_sta else (None, None, None)
        for i, (tokens, detail) in enumerate(zip(layers, details)):
            grid = tokens.transpose(1, 2).reshape(x.size(0), -1, height, width)
            factor = 2.0**(1 - i)
            grid = F.interpolate(
                grid,
                size=[int(height * factor),
                      int(width * factor)],
                mode='bilinear',
                align_corners=False)
            fused.append(
                grid if detail is None else torch.cat([grid, detail], dim=1))
        return tuple(
            norm(conv(feat))
            for conv, norm, feat in zip(self.convs, self.norms, fused))
