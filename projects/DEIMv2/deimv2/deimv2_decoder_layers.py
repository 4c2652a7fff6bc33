"""DEIMv2's decoder layer (RMSNorm, SwiGLU FFN, optional gateway) and the
D-FINE decoder that runs it.

Plain ``nn.Module`` classes built by :class:`DEIMv2`; attribute names are
upstream's (``TransformerDecoderLayer`` of ``engine/deim/deim_decoder.py``)
so that converted checkpoints load key for key.
"""
from typing import Dict, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .ports import FP16_MAX, DFINEDecoder, PerLevelDeformableAttention


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned per-channel ``scale`` (upstream
    ``deim_utils.RMSNorm``); computed in float32 and cast back, as
    upstream, so that half-precision inputs cannot underflow the mean
    square.

    Args:
        dims (int): Normalised width.
        eps (float): Added to the mean square. Defaults to 1e-6.
    """

    def __init__(self, dims: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dims))

    def forward(self, x: Tensor) -> Tensor:
        full = x.float()
        normed = full * torch.rsqrt(
            full.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.scale


class SwiGLUFFN(nn.Module):
    """``w3(silu(a) * b)`` with ``a, b`` the halves of ``w12(x)``
    (upstream ``deim_utils.SwiGLUFFN``; xavier weights, zero biases).

    Args:
        in_dims (int): Input and output width.
        hidden_dims (int): Width of each half.
    """

    def __init__(self, in_dims: int, hidden_dims: int) -> None:
        super().__init__()
        self.w12 = nn.Linear(in_dims, 2 * hidden_dims)
        self.w3 = nn.Linear(hidden_dims, in_dims)
        for linear in (self.w12, self.w3):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.constant_(linear.bias, 0)

    def forward(self, x: Tensor) -> Tensor:
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)


class RMSGate(nn.Module):
    """D-FINE's gated fusion of the query and the cross-attention output
    with an :class:`RMSNorm` instead of LayerNorm (upstream ``Gate`` with
    ``use_rmsnorm=True``): zero weights, both gates open at 0.5."""

    def __init__(self, dims: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * dims, 2 * dims)
        self.norm = RMSNorm(dims)
        nn.init.constant_(self.gate.bias, 0.0)
        nn.init.constant_(self.gate.weight, 0)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        gate1, gate2 = torch.sigmoid(self.gate(torch.cat([x1, x2],
                                                         -1))).chunk(2, -1)
        return self.norm(gate1 * x1 + gate2 * x2)


class DEIMv2DecoderLayer(nn.Module):
    """DEIMv2 decoder layer: D-FINE's layer (post-norm self-attention,
    per-level deformable cross-attention, post-norm FFN) with RMSNorm
    everywhere, a SwiGLU FFN, and the gateway optional (Atto, Femto and
    Pico use a residual sum and ``norm2``).

    Args:
        embed_dims (int): Width. Defaults to 256.
        num_heads (int): Attention heads. Defaults to 8.
        feedforward_channels (int): Upstream ``dim_feedforward``; the
            SwiGLU halves are ``feedforward_channels // 2`` wide.
            Defaults to 1024.
        dropout (float): Dropout. Defaults to 0.0.
        num_levels (int): Feature levels. Defaults to 3.
        num_points (int | Sequence[int]): Sampling points per level.
            Defaults to 4.
        use_gateway (bool): Fuse the cross-attention output through an
            :class:`RMSGate` (upstream ``use_gateway``); False adds it and
            applies ``norm2``. Defaults to True.
        activation (str, optional): Unused (the SwiGLU FFN has its own
            SiLU); accepted so that D-FINE's ``layer_cfg`` keys carry
            over. Defaults to None.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 feedforward_channels: int = 1024,
                 dropout: float = 0.0,
                 num_levels: int = 3,
                 num_points: Union[int, Sequence[int]] = 4,
                 use_gateway: bool = True,
                 activation: Optional[str] = None) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(
            embed_dims, num_heads, dropout=dropout, batch_first=True)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = RMSNorm(embed_dims)
        self.cross_attn = PerLevelDeformableAttention(embed_dims, num_heads,
                                                      num_levels, num_points)
        self.dropout2 = nn.Dropout(dropout)
        self.use_gateway = use_gateway
        if use_gateway:
            self.gateway = RMSGate(embed_dims)
        else:
            self.norm2 = RMSNorm(embed_dims)
        self.swish_ffn = SwiGLUFFN(embed_dims, feedforward_channels // 2)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = RMSNorm(embed_dims)

    def forward(self,
                query: Tensor,
                reference_points: Tensor,
                value: Sequence[Tensor],
                level_shapes: Sequence[Tuple[int, int]],
                attn_mask: Optional[Tensor] = None,
                query_pos: Optional[Tensor] = None) -> Tensor:
        with_pos = query if query_pos is None else query + query_pos
        attn = self.self_attn(
            with_pos, with_pos, query, attn_mask=attn_mask,
            need_weights=False)[0]
        query = self.norm1(query + self.dropout1(attn))
        with_pos = query if query_pos is None else query + query_pos
        cross = self.dropout2(
            self.cross_attn(with_pos, reference_points, value, level_shapes))
        if self.use_gateway:
            query = self.gateway(query, cross)
        else:
            query = self.norm2(query + cross)
        query = query + self.dropout4(self.swish_ffn(query))
        return self.norm3(query.clamp(min=-FP16_MAX, max=FP16_MAX))


class DEIMv2Decoder(DFINEDecoder):
    """D-FINE's decoder (fine-grained distribution refinement, LQE) with
    :class:`DEIMv2DecoderLayer` layers, and the query position embedding
    of the initial reference boxes for every layer (upstream DEIMv2
    computes it once, before the loop; D-FINE per layer from the refined
    boxes).

    Args:
        num_layers (int): Decoder layers.
        layer_cfg (dict): Keyword arguments of :class:`DEIMv2DecoderLayer`
            (``embed_dims``, ``num_heads``, ``feedforward_channels``,
            ``dropout``, ``num_levels``, ``num_points``, ``use_gateway``).
        eval_idx (int): Last layer run in eval mode; negative counts from
            the end. Defaults to -1.
        layer_scale (float): Must be 1: no DEIMv2 config widens the
            layers after ``eval_idx``. Defaults to 1.
        lqe_act (str): Activation of the LQE MLPs (upstream passes the
            decoder ``activation``, 'silu' in DEIMv2). Defaults to 'silu'.
        **kwargs: ``reg_max``, ``reg_scale``, ``up`` of
            :class:`DFINEDecoder`.
    """

    def __init__(self,
                 num_layers: int,
                 layer_cfg: dict,
                 eval_idx: int = -1,
                 layer_scale: float = 1,
                 lqe_act: str = 'silu',
                 **kwargs) -> None:
        if layer_scale != 1:
            raise ValueError(
                'DEIMv2 decoder.layer_scale must be 1 (every DEIMv2 config '
                'uses 1; upstream widens the layers after eval_idx '
                f'differently from D-FINE), but got {layer_scale}. Remove '
                'the key or set it to 1.')
        dfine_layer_cfg = {
            k: v
            for k, v in layer_cfg.items() if k not in ('use_gateway', )
        }
        super().__init__(
            num_layers,
            dict(dfine_layer_cfg, activation=lqe_act),
            eval_idx=eval_idx,
            layer_scale=layer_scale,
            **kwargs)
        # DFINEDecoder builds D-FINE layers; DEIMv2's replace them (the LQE
        # layers and buffers are D-FINE's as they are).
        self.layers = nn.ModuleList(
            DEIMv2DecoderLayer(**layer_cfg) for _ in range(num_layers))

    def forward(self, query: Tensor, reference_points: Tensor, memory: Tensor,
                level_shapes: Sequence[Tuple[int, int]],
                attn_mask: Optional[Tensor], bbox_head: nn.Module,
                query_pos_head: nn.Module) -> Dict[str, Tensor]:
        """``DFINEDecoder.forward`` with one query position embedding, of
        the initial reference boxes, handed to every layer (see the class
        doc); the arguments and outputs are D-FINE's."""
        initial = query_pos_head(reference_points.sigmoid())
        return super().forward(query, reference_points, memory, level_shapes,
                               attn_mask, bbox_head, lambda _: initial)
