"""Building blocks of RT-DETR's hybrid encoder and decoder.

Plain ``nn.Module`` classes, not registered: the registered components
(:class:`HybridEncoder`, :class:`RTDETR`) build them. Attribute names follow
lyuwenyu/RT-DETR so that converted checkpoints load key for key.
"""
import torch
from mmcv.ops import MultiScaleDeformableAttention
from mmcv.ops.multi_scale_deform_attn import (
    MultiScaleDeformableAttnFunction, multi_scale_deformable_attn_pytorch)
from mmdet.models.layers.transformer import inverse_sigmoid
from torch import Tensor, nn

from .conv_norm_folding import conv_norm, two_branch_conv_norm

ACTIVATIONS = {'relu': nn.ReLU, 'silu': nn.SiLU, 'gelu': nn.GELU}


def build_activation(
        name,
        inplace: bool = False,
        key: str = 'the act/enc_act key of the neck') -> nn.Module:
    """``nn.Identity`` for None, else the activation called ``name``;
    ``inplace`` for those that can (ReLU, SiLU), where the caller's input
    is a fresh tensor no one else reads (upstream builds them in place).
    ``key`` names the config key that gave ``name``, for the error."""
    if name is None:
        return nn.Identity()
    if name not in ACTIVATIONS:
        raise ValueError(
            f'RT-DETR activation must be one of {sorted(ACTIVATIONS)} or '
            f'None, but got {name!r}. Fix {key} in the model config.')
    module = ACTIVATIONS[name]()
    if inplace and hasattr(module, 'inplace'):
        module.inplace = True
    return module


class ConvNormLayer(nn.Module):
    """Conv2d (no bias, 'same' padding) + BatchNorm2d + activation."""

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 kernel_size: int,
                 stride: int = 1,
                 act=None) -> None:
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding=(kernel_size - 1) // 2,
            bias=False)
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = build_activation(act, inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        # differs from upstream: at inference conv and norm run as one
        # folded conv (conv_norm_folding; same values up to rounding)
        return self.act(conv_norm(self, self.conv, self.norm, x))


class RepVggBlock(nn.Module):
    """RepVGG block in its training form: a 3x3 and a 1x1 conv-BN branch,
    summed, then the activation. Upstream's deploy form fuses both into one
    biased 3x3 ``conv``; convert checkpoints before fusing. At inference
    this block runs that fused conv itself (folded from the two branches,
    cached until a weight changes; see ``conv_norm_folding``), so a
    checkpoint keeps its training form."""

    def __init__(self, channels: int, act='silu') -> None:
        super().__init__()
        self.conv1 = ConvNormLayer(channels, channels, 3, act=None)
        self.conv2 = ConvNormLayer(channels, channels, 1, act=None)
        self.act = build_activation(act, inplace=True)

    def forward(self, x: Tensor) -> Tensor:
        fused = two_branch_conv_norm(self, (self.conv1.conv, self.conv1.norm),
                                     (self.conv2.conv, self.conv2.norm), x)
        if fused is not None:
            return self.act(fused)
        return self.act(self.conv1(x) + self.conv2(x))


class CSPRepLayer(nn.Module):
    """CSP block of the CCFM: two 1x1 projections, RepVGG blocks on one of
    them, the sum, and a 1x1 output conv when the hidden width differs."""

    def __init__(self,
                 in_channels: int,
                 out_channels: int,
                 num_blocks: int = 3,
                 expansion: float = 1.0,
                 act='silu') -> None:
        super().__init__()
        hidden = int(out_channels * expansion)
        self.conv1 = ConvNormLayer(in_channels, hidden, 1, act=act)
        self.conv2 = ConvNormLayer(in_channels, hidden, 1, act=act)
        self.bottlenecks = nn.Sequential(
            *[RepVggBlock(hidden, act=act) for _ in range(num_blocks)])
        self.conv3 = (
            ConvNormLayer(hidden, out_channels, 1, act=act)
            if hidden != out_channels else nn.Identity())

    def forward(self, x: Tensor) -> Tensor:
        return self.conv3(self.bottlenecks(self.conv1(x)) + self.conv2(x))


class AIFILayer(nn.Module):
    """Post-norm transformer encoder layer of the AIFI (intra-scale
    interaction) module: self-attention with the position embedding added
    to queries and keys, then an FFN."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 feedforward_channels: int,
                 dropout: float = 0.0,
                 act='gelu') -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(
            embed_dims, num_heads, dropout, batch_first=True)
        self.linear1 = nn.Linear(embed_dims, feedforward_channels)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(feedforward_channels, embed_dims)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = build_activation(act)

    def forward(self, x: Tensor, pos_embed: Tensor) -> Tensor:
        q = k = x + pos_embed
        # need_weights=False as upstream: same output, no averaged weights
        attn = self.self_attn(q, k, x, need_weights=False)[0]
        x = self.norm1(x + self.dropout1(attn))
        ffn = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.norm2(x + self.dropout2(ffn))


class AIFIEncoder(nn.Module):
    """A stack of :class:`AIFILayer` (upstream ``TransformerEncoder``)."""

    def __init__(self, num_layers: int, **layer_kwargs) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            [AIFILayer(**layer_kwargs) for _ in range(num_layers)])

    def forward(self, x: Tensor, pos_embed: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, pos_embed)
        return x


def sincos_pos_embed_2d(width: int, height: int, embed_dims: int,
                        temperature: float) -> Tensor:
    """Fixed 2D sin-cos position embedding, shape (1, width*height, dims).

    Reproduces upstream's layout exactly, including its width-major token
    order (``meshgrid(w, h, indexing='ij')``), which converted checkpoints
    were trained with.
    """
    if embed_dims % 4:
        raise ValueError(
            'HybridEncoder hidden_dim must be divisible by 4 for the 2D '
            f'sin-cos position embedding, but got {embed_dims}.')
    grid_w, grid_h = torch.meshgrid(
        torch.arange(width, dtype=torch.float32),
        torch.arange(height, dtype=torch.float32),
        indexing='ij')
    pos_dim = embed_dims // 4
    omega = 1. / temperature**(
        torch.arange(pos_dim, dtype=torch.float32) / pos_dim)
    out_w = grid_w.flatten()[:, None] * omega[None]
    out_h = grid_h.flatten()[:, None] * omega[None]
    return torch.cat(
        [out_w.sin(), out_w.cos(),
         out_h.sin(), out_h.cos()], dim=1)[None]


class DeformableCrossAttention(MultiScaleDeformableAttention):
    """mmcv's ``MultiScaleDeformableAttention`` (batch first) on
    (cx, cy, w, h) reference boxes, without its host-side shape check.

    ``forward`` replaces mmcv's with the same computation for the inputs
    :class:`RTDETRDecoderLayer` passes (no key padding mask, no separate
    identity): value projection, sampling offsets scaled by half the box
    size over ``num_points`` around each box centre, softmax attention
    weights over levels and points, mmcv's CUDA kernel (the PyTorch
    implementation elsewhere), output projection, dropout, residual.
    mmcv asserts ``(spatial_shapes[:, 0] * spatial_shapes[:, 1]).sum() ==
    num_value`` on every call, which reads a device tensor on the host:
    the host waits for the device in every decoder layer, at the first one
    for the whole backbone and encoder. Here ``spatial_shapes`` and the
    value are built together by ``RTDETR.pre_transformer``, so the check
    is left out. Parameters and names are mmcv's (and upstream's).

    Accepts the arguments of ``MultiScaleDeformableAttention``.
    """

    def forward(self, query: Tensor, value: Tensor, query_pos: Tensor,
                reference_points: Tensor, spatial_shapes: Tensor,
                level_start_index: Tensor) -> Tensor:
        """Attend from each query to points around its reference box.

        Args:
            query (Tensor): (bs, num_queries, embed_dims).
            value (Tensor): Flattened levels, (bs, num_values, embed_dims).
            query_pos (Tensor): Added to ``query`` (not to the residual).
            reference_points (Tensor): Normalized (cx, cy, w, h) per
                level, (bs, num_queries, num_levels, 4).
            spatial_shapes (Tensor): (h, w) of each level, (num_levels, 2).
            level_start_index (Tensor): First value of each level.

        Returns:
            Tensor: ``query`` plus the attention output, same shape.
        """
        identity = query
        query = query + query_pos
        batch_size, num_queries, _ = query.shape
        heads, levels, points = self.num_heads, self.num_levels, \
            self.num_points
        value = self.value_proj(value).view(batch_size, value.size(1), heads,
                                            -1)
        offsets = self.sampling_offsets(query).view(batch_size, num_queries,
                                                    heads, levels, points, 2)
        weights = self.attention_weights(query).view(
            batch_size, num_queries, heads,
            levels * points).softmax(-1).view(batch_size, num_queries, heads,
                                              levels, points)
        boxes = reference_points[:, :, None, :, None]
        locations = boxes[..., :2] + offsets / points * boxes[..., 2:] * 0.5
        if value.is_cuda:
            output = MultiScaleDeformableAttnFunction.apply(
                value, spatial_shapes, level_start_index, locations, weights,
                self.im2col_step)
        else:
            output = multi_scale_deformable_attn_pytorch(
                value, spatial_shapes, locations, weights)
        return self.dropout(self.output_proj(output)) + identity


class RTDETRDecoderLayer(nn.Module):
    """RT-DETR decoder layer: post-norm self-attention over all queries
    (dn mask applied), multi-scale deformable cross-attention on box
    reference points, and an FFN. Names follow upstream's
    ``TransformerDecoderLayer``; ``cross_attn`` is mmcv's
    ``MultiScaleDeformableAttention`` (:class:`DeformableCrossAttention`),
    whose parameters are upstream's.

    Args:
        embed_dims (int): Query width. Defaults to 256.
        num_heads (int): Attention heads of both attentions. Defaults to 8.
        feedforward_channels (int): Hidden width of the FFN. Defaults to
            1024.
        dropout (float): Dropout of attentions and FFN. Defaults to 0.0.
        num_levels (int): Feature levels the cross-attention samples.
            Defaults to 3.
        num_points (int): Sampling points per head and level. Defaults
            to 4.
        activation (str): Activation of the FFN: 'relu' (RT-DETR v1/v2),
            'silu' (DEIM's RT-DETRv2) or 'gelu'. It has no parameters, so
            the state dict is the same for every choice. Defaults to
            'relu'.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 feedforward_channels: int = 1024,
                 dropout: float = 0.0,
                 num_levels: int = 3,
                 num_points: int = 4,
                 activation: str = 'relu') -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(
            embed_dims, num_heads, dropout=dropout, batch_first=True)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.cross_attn = DeformableCrossAttention(
            embed_dims=embed_dims,
            num_heads=num_heads,
            num_levels=num_levels,
            num_points=num_points,
            dropout=dropout,
            batch_first=True)
        self.norm2 = nn.LayerNorm(embed_dims)
        self.linear1 = nn.Linear(embed_dims, feedforward_channels)
        self.activation = build_activation(
            activation, key='decoder.layer_cfg.activation')
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(feedforward_channels, embed_dims)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(embed_dims)

    def forward(self,
                query: Tensor,
                query_pos: Tensor,
                memory: Tensor,
                reference_points: Tensor,
                spatial_shapes: Tensor,
                level_start_index: Tensor,
                attn_mask=None) -> Tensor:
        q = k = query + query_pos
        attn = self.self_attn(
            q, k, query, attn_mask=attn_mask, need_weights=False)[0]
        query = self.norm1(query + self.dropout1(attn))
        # mmcv adds query_pos to the query and the (dropped-out) output to
        # the identity (the query without pos), as upstream does.
        num_levels = spatial_shapes.size(0)
        query = self.norm2(
            self.cross_attn(
                query=query,
                value=memory,
                query_pos=query_pos,
                reference_points=reference_points[:, :, None].expand(
                    -1, -1, num_levels, -1),
                spatial_shapes=spatial_shapes,
                level_start_index=level_start_index))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(query))))
        return self.norm3(query + self.dropout4(ffn))


class RTDETRDecoder(nn.Module):
    """Stack of :class:`RTDETRDecoderLayer` with iterative box refinement.

    Layer ``i`` attends around the detached boxes of layer ``i - 1`` (the
    selected encoder boxes for ``i = 0``), with the position embedding
    ``query_pos_head(boxes)``, and refines them with ``reg_branches[i]``,
    which runs once per layer. Its output box is
    ``sigmoid(delta_i + inverse_sigmoid(refined_{i-1}))`` with
    ``refined_{i-1}`` *not* detached, so layer ``i``'s boxes get gradients
    through layer ``i - 1``'s regression branch as in upstream's training
    mode; the next layer gets the same values detached.

    In eval mode the loop stops after layer ``eval_idx`` (upstream's
    ``TransformerDecoder``), whose predictions are then the last ones.

    Args:
        num_layers (int): Number of decoder layers.
        layer_cfg (dict): Keyword arguments of :class:`RTDETRDecoderLayer`.
        eval_idx (int): Decoder layer whose predictions are evaluated;
            negative values count from the end (upstream ``eval_idx``:
            -1, or 2 for the -M models). Defaults to -1.
    """

    def __init__(self,
                 num_layers: int,
                 layer_cfg: dict,
                 eval_idx: int = -1) -> None:
        super().__init__()
        if not -num_layers <= eval_idx < num_layers:
            raise ValueError(
                f'RTDETR decoder.eval_idx must be in [-{num_layers}, '
                f'{num_layers - 1}] for decoder.num_layers={num_layers}, '
                f'but got {eval_idx}. Use -1 for the last layer.')
        self.num_layers = num_layers
        self.eval_idx = eval_idx % num_layers
        self.layers = nn.ModuleList(
            [RTDETRDecoderLayer(**layer_cfg) for _ in range(num_layers)])

    def forward(self, query: Tensor, reference_points: Tensor, memory: Tensor,
                spatial_shapes: Tensor, level_start_index: Tensor, attn_mask,
                reg_branches, query_pos_head) -> tuple:
        """Run the layers.

        Returns:
            tuple[Tensor]: Hidden states and predicted (cx, cy, w, h)
            boxes of every layer run, (num_run, bs, num_queries, dims)
            and (num_run, bs, num_queries, 4); ``num_run`` is
            ``num_layers`` in training and ``eval_idx + 1`` in eval mode.
        """
        hidden_states, layer_boxes = [], []
        boxes = reference_points  # detached input boxes of this layer
        refined = reference_points  # previous refined boxes, in graph
        num_run = self.num_layers if self.training else self.eval_idx + 1
        for layer, reg_branch in zip(self.layers[:num_run], reg_branches):
            query = layer(query, query_pos_head(boxes), memory, boxes,
                          spatial_shapes, level_start_index, attn_mask)
            delta = reg_branch(query)
            hidden_states.append(query)
            layer_boxes.append((delta + inverse_sigmoid(refined)).sigmoid())
            refined = (delta + inverse_sigmoid(boxes)).sigmoid()
            boxes = refined.detach()
        return torch.stack(hidden_states), torch.stack(layer_boxes)


class StaticTensorCache:
    """Tensors that depend only on a feature size, device and dtype
    (position embeddings, anchors), built once per key.

    Not a buffer: nothing enters the state dict, and a new input size or
    device just adds an entry. ``enabled = False`` rebuilds on every call
    (the uncached behaviour, for benchmarks).
    """

    def __init__(self) -> None:
        self.enabled = True
        self._entries = {}

    def get(self, key: tuple, build):
        """``build()``'s result for ``key``, built at most once while
        enabled."""
        if not self.enabled:
            return build()
        if key not in self._entries:
            self._entries[key] = build()
        return self._entries[key]
