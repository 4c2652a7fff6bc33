"""The plain ViTs DEIMv2's DINOv3 backbones are built on: DINOv3's ViT-S
and ViT-S+ (``engine/backbone/dinov3``) and DEIMv2's distilled ViT-Tiny /
Tiny+ (``engine/backbone/vit_tiny.py``).

Both are pre-norm ViTs with 2D rotary position embeddings on the patch
tokens; they differ in options, all of them arguments of :class:`ViT`.
Parameter names are upstream's, so the backbone-only files DEIMv2 starts
from load as they are and detector checkpoints key for key.
"""
import math
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmengine.model import BaseModule
from torch import Tensor, nn

FFN_TYPES = ('mlp', 'swiglu')
# DINOv3's SwiGLU hidden width is rounded up to a multiple of this.
SWIGLU_ALIGN = 8


class RopePositionEmbedding(nn.Module):
    """2D rotary embedding of a patch grid: coordinates in [-1, 1] per
    axis (``normalize_coords='separate'``), ``head_dims // 4`` periods
    ``base ** (2 i / (head_dims / 2))`` (the ``periods`` buffer, saved in
    checkpoints), and in training an optional random rescaling of the
    coordinates by ``exp(U(-log r, log r))`` (DINOv3: ``r = 2``).

    Args:
        head_dims (int): Width of one attention head (a multiple of 4).
        base (float): Period base. Defaults to 100.0.
        rescale_coords (float, optional): ``r`` above; None for no
            rescaling. Defaults to None.
    """

    def __init__(self,
                 head_dims: int,
                 base: float = 100.0,
                 rescale_coords: Optional[float] = None) -> None:
        super().__init__()
        if head_dims % 4:
            raise ValueError(
                'DEIMv2 ViT: embed_dims / num_heads must be a multiple of 4 '
                f'for 2D rotary embeddings, but it is {head_dims}.')
        self.rescale_coords = rescale_coords
        exponents = 2 * torch.arange(head_dims // 4) / (head_dims // 2)
        self.register_buffer('periods', base**exponents)

    def forward(self, height: int, width: int) -> Tuple[Tensor, Tensor]:
        """sin and cos, each (height * width, head_dims)."""
        periods = self.periods
        coords_h = torch.arange(0.5, height).to(periods) / height
        coords_w = torch.arange(0.5, width).to(periods) / width
        coords = torch.stack(
            torch.meshgrid(coords_h, coords_w, indexing='ij'), -1)
        coords = 2.0 * coords.flatten(0, 1) - 1.0
        if self.training and self.rescale_coords is not None:
            log_r = math.log(self.rescale_coords)
            coords = coords * periods.new_empty(1).uniform_(-log_r,
                                                            log_r).exp()
        angles = 2 * math.pi * coords[:, :, None] / periods
        angles = angles.flatten(1, 2).repeat(1, 2)
        return angles.sin(), angles.cos()


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class MaskedKBiasLinear(nn.Linear):
    """The qkv projection of DINOv3: its bias is multiplied by the
    ``bias_mask`` buffer (saved in DINOv3's files: 0 on the key part).
    Upstream fills the buffer with NaN until a file is loaded; here it
    starts as that mask (1, 0, 1 on the q, k, v thirds), so a model
    trained from scratch is finite."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__(in_features, out_features)
        third = out_features // 3
        mask = torch.ones(out_features)
        mask[third:2 * third] = 0
        self.register_buffer('bias_mask', mask)

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight,
                        self.bias * self.bias_mask.to(self.bias.dtype))


class SelfAttention(nn.Module):
    """Multi-head self-attention with rotary embeddings on the last
    ``height * width`` (patch) tokens."""

    def __init__(self, dims: int, num_heads: int, mask_k_bias: bool) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = (
            MaskedKBiasLinear(dims, 3 * dims) if mask_k_bias else nn.Linear(
                dims, 3 * dims))
        self.proj = nn.Linear(dims, dims)

    def forward(self, x: Tensor, rope: Tuple[Tensor, Tensor]) -> Tensor:
        bs, num_tokens, dims = x.shape
        qkv = self.qkv(x).reshape(bs, num_tokens, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        sin, cos = rope
        prefix = num_tokens - sin.shape[0]

        def rotate(t: Tensor) -> Tensor:
            patches = t[:, :, prefix:]
            patches = patches * cos + _rotate_half(patches) * sin
            return torch.cat([t[:, :, :prefix], patches], dim=2)

        out = F.scaled_dot_product_attention(rotate(q), rotate(k), v)
        return self.proj(out.transpose(1, 2).reshape(bs, num_tokens, dims))


class Mlp(nn.Module):
    """fc1, GELU, fc2."""

    def __init__(self, dims: int, hidden_dims: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dims, hidden_dims)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dims, dims)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class SwiGLU(nn.Module):
    """DINOv3's SwiGLU FFN: ``w3(silu(w1 x) * w2 x)``, hidden width
    ``2 / 3`` of ``hidden_dims`` rounded up to a multiple of 8."""

    def __init__(self, dims: int, hidden_dims: int) -> None:
        super().__init__()
        width = int(hidden_dims * 2 / 3)
        width += -width % SWIGLU_ALIGN
        self.w1 = nn.Linear(dims, width)
        self.w2 = nn.Linear(dims, width)
        self.w3 = nn.Linear(width, dims)

    def forward(self, x: Tensor) -> Tensor:
        return self.w3(F.silu(self.w1(x)) * self.w2(x))


class LayerScale(nn.Module):
    """Per-channel scale ``gamma`` of a residual branch."""

    def __init__(self, dims: int, init_value: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dims, ), init_value))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm transformer block (attention, FFN), each residual branch
    optionally scaled (:class:`LayerScale`, ``ls1`` / ``ls2``)."""

    def __init__(self, dims: int, num_heads: int, ffn_ratio: float,
                 ffn_type: str, layerscale: Optional[float], mask_k_bias: bool,
                 norm_eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dims, eps=norm_eps)
        self.attn = SelfAttention(dims, num_heads, mask_k_bias)
        self.norm2 = nn.LayerNorm(dims, eps=norm_eps)
        ffn = Mlp if ffn_type == 'mlp' else SwiGLU
        self.mlp = ffn(dims, int(dims * ffn_ratio))
        if layerscale is not None:
            self.ls1 = LayerScale(dims, layerscale)
            self.ls2 = LayerScale(dims, layerscale)
        else:
            self.ls1 = self.ls2 = nn.Identity()

    def forward(self, x: Tensor, rope: Tuple[Tensor, Tensor]) -> Tensor:
        x = x + self.ls1(self.attn(self.norm1(x), rope))
        return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
    """Non-overlapping patches to tokens (a strided conv ``proj``)."""

    def __init__(self, patch_size: int, dims: int) -> None:
        super().__init__()
        self.proj = nn.Conv2d(3, dims, patch_size, patch_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(x)


class ViT(BaseModule):
    """A ViT returning the patch tokens of chosen blocks.

    DINOv3 ViT-S (``dinov3_vits16``): ``embed_dims=384, num_heads=6,
    ffn_type='mlp', num_storage_tokens=4, layerscale=1e-5,
    mask_k_bias=True, norm_eps=1e-5, final_norm=True,
    with_mask_token=True, rope_rescale=2``; ViT-S+ the same with
    ``ffn_type='swiglu', ffn_ratio=6``. DEIMv2's distilled ViT-Tiny:
    ``embed_dims=192, num_heads=3`` and the defaults below; Tiny+:
    ``embed_dims=256, num_heads=4``.

    Args:
        embed_dims (int): Token width. Defaults to 192.
        num_heads (int): Attention heads. Defaults to 3.
        depth (int): Blocks. Defaults to 12.
        patch_size (int): Patch size. Defaults to 16.
        ffn_ratio (float): FFN hidden width over ``embed_dims``.
            Defaults to 4.0.
        ffn_type (str): 'mlp' (GELU) or 'swiglu'. Defaults to 'mlp'.
        num_storage_tokens (int): Register tokens after the class token.
            Defaults to 0.
        layerscale (float, optional): Initial LayerScale value; None for
            none. Defaults to None.
        mask_k_bias (bool): DINOv3's masked key bias. Defaults to False.
        norm_eps (float): LayerNorm eps. Defaults to 1e-6.
        final_norm (bool): Apply the final LayerNorm ``norm`` to the
            returned tokens (DINOv3's ``get_intermediate_layers``).
            Defaults to False.
        with_mask_token (bool): Hold DINOv3's ``mask_token`` (added times
            0 to the class token, as upstream, so that it is in the graph
            of every step). Defaults to False.
        rope_base (float): Rotary period base. Defaults to 100.0.
        rope_rescale (float, optional): Training-time rotary coordinate
            rescaling range. Defaults to None.
        out_indices (Sequence[int]): Blocks whose patch tokens are
            returned. Defaults to (3, 7, 11).
        init_cfg (dict, optional): MMEngine init config, e.g.
            ``dict(type='Pretrained', checkpoint='vitt_distill.pt')``:
            upstream's backbone files hold this module's keys. Defaults to
            None.
    """

    def __init__(self,
                 embed_dims: int = 192,
                 num_heads: int = 3,
                 depth: int = 12,
                 patch_size: int = 16,
                 ffn_ratio: float = 4.0,
                 ffn_type: str = 'mlp',
                 num_storage_tokens: int = 0,
                 layerscale: Optional[float] = None,
                 mask_k_bias: bool = False,
                 norm_eps: float = 1e-6,
                 final_norm: bool = False,
                 with_mask_token: bool = False,
                 rope_base: float = 100.0,
                 rope_rescale: Optional[float] = None,
                 out_indices: Sequence[int] = (3, 7, 11),
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if ffn_type not in FFN_TYPES:
            raise ValueError(f'DEIMv2 ViT ffn_type must be one of '
                             f'{FFN_TYPES}, but got {ffn_type!r}.')
        bad = [i for i in out_indices if not 0 <= i < depth]
        if bad or not out_indices:
            raise ValueError(
                f'DEIMv2 ViT out_indices (upstream interaction_indexes) must '
                f'be block indices in 0..{depth - 1}, but got '
                f'{list(out_indices)}.')
        self.embed_dims = embed_dims
        self.patch_size = patch_size
        self.out_indices = tuple(out_indices)
        self.final_norm = final_norm
        self.patch_embed = PatchEmbed(patch_size, embed_dims)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.num_storage_tokens = num_storage_tokens
        if num_storage_tokens:
            self.storage_tokens = nn.Parameter(
                torch.zeros(1, num_storage_tokens, embed_dims))
        if with_mask_token:
            self.mask_token = nn.Parameter(torch.zeros(1, embed_dims))
        self.rope_embed = RopePositionEmbedding(embed_dims // num_heads,
                                                rope_base, rope_rescale)
        self.blocks = nn.ModuleList(
            Block(embed_dims, num_heads, ffn_ratio, ffn_type, layerscale,
                  mask_k_bias, norm_eps) for _ in range(depth))
        if final_norm:
            self.norm = nn.LayerNorm(embed_dims, eps=norm_eps)
        self._init_tokens()

    def _init_tokens(self) -> None:
        """Upstream: class (and storage) tokens N(0, 0.02), linear
        weights truncated N(0, 0.02) with zero biases."""
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        if self.num_storage_tokens:
            nn.init.normal_(self.storage_tokens, std=0.02)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, x: Tensor) -> List[Tensor]:
        """Patch tokens of the ``out_indices`` blocks, each (bs,
        H / patch_size * W / patch_size, embed_dims)."""
        patches = self.patch_embed(x)
        height, width = patches.shape[-2:]
        tokens = patches.flatten(2).transpose(1, 2)
        cls_token = self.cls_token
        if hasattr(self, 'mask_token'):
            cls_token = cls_token + 0 * self.mask_token
        # x.size(0), not len(x): a trace (ONNX export) keeps the batch
        # dimension symbolic only through size()
        prefix = [cls_token.expand(x.size(0), -1, -1)]
        if self.num_storage_tokens:
            prefix.append(self.storage_tokens.expand(x.size(0), -1, -1))
        tokens = torch.cat(prefix + [tokens], dim=1)
        rope = self.rope_embed(height, width)
        outs = []
        for index, block in enumerate(self.blocks):
            tokens = block(tokens, rope)
            if index in self.out_indices:
                out = self.norm(tokens) if self.final_norm else tokens
                outs.append(out[:, 1 + self.num_storage_tokens:])
        return outs
