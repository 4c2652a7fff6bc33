"""Building blocks of D-FINE's decoder: deformable attention with a point
count per level, the gated cross-attention layer, the location-quality
estimator (LQE) and the decoder with fine-grained distribution refinement.

Plain ``nn.Module`` classes built by :class:`DFINE`; attribute names
follow upstream's ``TransformerDecoder`` so that converted checkpoints
load key for key.
"""
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from mmdet.models.layers.transformer import inverse_sigmoid
from torch import Tensor, nn

from mmddp_ext.utils.torch_private import cached_until_written
from .fdr import distance2bbox, integral, weighting_function
from .ports import build_activation

# upstream's inverse_sigmoid eps (mmdet's default is also 1e-5)
INVERSE_SIGMOID_EPS = 1e-5
# LQE: top-k probabilities per edge distribution, hidden width, layers
LQE_TOP_K = 4
LQE_HIDDEN = 64
LQE_LAYERS = 2
# Query position embeddings are clamped to this range (upstream).
QUERY_POS_LIMIT = 10.0
# The largest float16 value: upstream clamps before the last norm so that
# mixed precision cannot overflow to inf there.
FP16_MAX = 65504.0


class MLP(nn.Module):
    """``num_layers`` linear layers with ``act`` between them (none after
    the last); upstream's ``MLP`` (mmdet's has a fixed ReLU).

    Args:
        input_dim (int): Input width.
        hidden_dim (int): Width of the hidden layers.
        output_dim (int): Output width.
        num_layers (int): Number of linear layers.
        act (str): Activation, 'relu' (D-FINE) or 'silu' (DEIM's
            ``mlp_act``). Defaults to 'relu'.
    """

    def __init__(self,
                 input_dim: int,
                 hidden_dim: int,
                 output_dim: int,
                 num_layers: int,
                 act: str = 'relu') -> None:
        super().__init__()
        dims = [input_dim] + [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(
            nn.Linear(n, k) for n, k in zip(dims[:-1], dims[1:]))
        self.act = build_activation(act)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers[:-1]:
            x = self.act(layer(x))
        return self.layers[-1](x)


def _points_per_level(num_points: Union[int, Sequence[int]],
                      num_levels: int) -> List[int]:
    if isinstance(num_points, int):
        return [num_points] * num_levels
    if len(num_points) != num_levels:
        raise ValueError(
            'DFINE decoder.layer_cfg.num_points needs one entry per level '
            f'({num_levels}), but got {list(num_points)}. Use e.g. [3, 6, '
            '3] for 3 levels, [6, 6] for 2, or one int for all.')
    return list(num_points)


class PerLevelDeformableAttention(nn.Module):
    """Multi-scale deformable attention with its own number of sampling
    points per level and box-scaled offsets (upstream
    ``MSDeformableAttention`` with ``method='default'``).

    Each head samples ``num_points[l]`` points on level ``l`` around the
    reference box centre, at offsets scaled by the box size, ``offset_scale``
    and ``1 / num_points[l]``, bilinearly (``grid_sample``, zero padding),
    and averages them with softmax weights taken over all points of all
    levels. There is no value or output projection (upstream has none).

    Args:
        embed_dims (int): Query and value width.
        num_heads (int): Attention heads.
        num_levels (int): Feature levels.
        num_points (int | Sequence[int]): Points per level.
        offset_scale (float): Scale of the offsets. Defaults to 0.5.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 num_levels: int,
                 num_points: Union[int, Sequence[int]],
                 offset_scale: float = 0.5) -> None:
        super().__init__()
        if embed_dims % num_heads:
            raise ValueError(
                f'DFINE decoder embed_dims ({embed_dims}) must be divisible '
                f'by num_heads ({num_heads}).')
        self.num_heads = num_heads
        self.num_levels = num_levels
        self.offset_scale = offset_scale
        self.num_points_list = _points_per_level(num_points, num_levels)
        total = sum(self.num_points_list)
        scale = [1 / n for n in self.num_points_list for _ in range(n)]
        # Derived from the config; upstream saves it, the converter checks
        # it against the config and does not load it.
        self.register_buffer(
            'num_points_scale',
            torch.tensor(scale, dtype=torch.float32),
            persistent=False)
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * total * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * total)
        self.init_weights()

    def init_weights(self) -> None:
        """Upstream's init: zero weights; offset biases point each head in
        its own direction, ``k`` units out for the ``k``-th point of a
        level; uniform attention."""
        nn.init.constant_(self.sampling_offsets.weight, 0)
        thetas = torch.arange(
            self.num_heads,
            dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = grid / grid.abs().max(-1, keepdim=True).values
        steps = torch.cat(
            [torch.arange(1, n + 1) for n in self.num_points_list])
        grid = grid[:, None, :] * steps[None, :, None]
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.flatten())
        nn.init.constant_(self.attention_weights.weight, 0)
        nn.init.constant_(self.attention_weights.bias, 0)

    def forward(self, query: Tensor, reference_points: Tensor,
                value: Sequence[Tensor],
                level_shapes: Sequence[Tuple[int, int]]) -> Tensor:
        """Sample and average.

        Args:
            query (Tensor): (bs, num_queries, embed_dims), position
                embedding included.
            reference_points (Tensor): Boxes (cx, cy, w, h) in [0, 1],
                (bs, num_queries, 1, 4).
            value (Sequence[Tensor]): One (bs * num_heads, head_dims, H_l,
                W_l) map per level.
            level_shapes (Sequence[tuple]): (H_l, W_l) per level.

        Returns:
            Tensor: (bs, num_queries, embed_dims).
        """
        bs, num_queries = query.shape[:2]
        total = sum(self.num_points_list)
        offsets = self.sampling_offsets(query).reshape(bs, num_queries,
                                                       self.num_heads, total,
                                                       2)
        weights = F.softmax(
            self.attention_weights(query).reshape(bs, num_queries,
                                                  self.num_heads, total), -1)
        scale = self.num_points_scale.to(query.dtype)[:, None]
        boxes = reference_points[:, :, None]
        locations = boxes[..., :2] + (
            offsets * scale * boxes[..., 2:] * self.offset_scale)
        # grid_sample's grid is in [-1, 1]; one batch entry per (image,
        # head)
        grids = (2 * locations - 1).permute(0, 2, 1, 3, 4).flatten(0, 1)
        sampled = [
            F.grid_sample(
                level_value,
                grid,
                mode='bilinear',
                padding_mode='zeros',
                align_corners=False) for level_value, grid in zip(
                    value, grids.split(self.num_points_list, dim=-2))
        ]
        weights = weights.permute(0, 2, 1, 3).reshape(bs * self.num_heads, 1,
                                                      num_queries, total)
        output = (torch.cat(sampled, -1) * weights).sum(-1)
        return output.reshape(bs, -1, num_queries).transpose(1, 2)


class Gate(nn.Module):
    """Gated fusion of the query and the cross-attention output: sigmoid
    gates from both, a weighted sum, LayerNorm (upstream ``Gate``)."""

    def __init__(self, embed_dims: int) -> None:
        super().__init__()
        self.gate = nn.Linear(2 * embed_dims, 2 * embed_dims)
        self.norm = nn.LayerNorm(embed_dims)
        self.init_weights()

    def init_weights(self) -> None:
        """Zero weights, both gates open at 0.5 (upstream)."""
        nn.init.constant_(self.gate.bias, 0.0)
        nn.init.constant_(self.gate.weight, 0)

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        gate1, gate2 = torch.sigmoid(self.gate(torch.cat([x1, x2],
                                                         -1))).chunk(2, -1)
        return self.norm(gate1 * x1 + gate2 * x2)


class DFINEDecoderLayer(nn.Module):
    """D-FINE decoder layer: post-norm self-attention (dn mask applied),
    deformable cross-attention fused through a :class:`Gate` (instead of a
    residual sum), and a post-norm FFN (upstream
    ``TransformerDecoderLayer``).

    Args:
        embed_dims (int): Width. Defaults to 256.
        num_heads (int): Attention heads. Defaults to 8.
        feedforward_channels (int): FFN width. Defaults to 1024.
        dropout (float): Dropout. Defaults to 0.0.
        activation (str): FFN activation ('relu'; DEIM: 'silu').
            Defaults to 'relu'.
        num_levels (int): Feature levels. Defaults to 3.
        num_points (int | Sequence[int]): Sampling points per level.
            Defaults to 4.
        layer_scale (float, optional): Width multiplier of this layer
            (upstream ``layer_scale`` for the layers after ``eval_idx``).
            Defaults to None.
    """

    def __init__(self,
                 embed_dims: int = 256,
                 num_heads: int = 8,
                 feedforward_channels: int = 1024,
                 dropout: float = 0.0,
                 activation: str = 'relu',
                 num_levels: int = 3,
                 num_points: Union[int, Sequence[int]] = 4,
                 layer_scale: Optional[float] = None) -> None:
        super().__init__()
        if layer_scale is not None:
            feedforward_channels = round(layer_scale * feedforward_channels)
            embed_dims = round(layer_scale * embed_dims)
        self.self_attn = nn.MultiheadAttention(
            embed_dims, num_heads, dropout=dropout, batch_first=True)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.cross_attn = PerLevelDeformableAttention(embed_dims, num_heads,
                                                      num_levels, num_points)
        self.dropout2 = nn.Dropout(dropout)
        self.gateway = Gate(embed_dims)
        self.linear1 = nn.Linear(embed_dims, feedforward_channels)
        self.activation = build_activation(activation)
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(feedforward_channels, embed_dims)
        self.dropout4 = nn.Dropout(dropout)
        self.norm3 = nn.LayerNorm(embed_dims)
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(self,
                query: Tensor,
                reference_points: Tensor,
                value: Sequence[Tensor],
                level_shapes: Sequence[Tuple[int, int]],
                attn_mask: Optional[Tensor] = None,
                query_pos: Optional[Tensor] = None) -> Tensor:
        with_pos = query if query_pos is None else query + query_pos
        # need_weights=False: the same output without averaged weights
        attn = self.self_attn(
            with_pos, with_pos, query, attn_mask=attn_mask,
            need_weights=False)[0]
        query = self.norm1(query + self.dropout1(attn))
        with_pos = query if query_pos is None else query + query_pos
        cross = self.cross_attn(with_pos, reference_points, value,
                                level_shapes)
        query = self.gateway(query, self.dropout2(cross))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(query))))
        query = query + self.dropout4(ffn)
        return self.norm3(query.clamp(min=-FP16_MAX, max=FP16_MAX))


class LQE(nn.Module):
    """Location-quality estimator: adds to the class logits a score
    computed from the top-``k`` probabilities (and their mean) of each edge
    distribution; a sharp distribution means a well-localised box.

    Args:
        reg_max (int): Index of the last bin.
        act (str): Activation of the MLP. Defaults to 'relu'.
    """

    def __init__(self, reg_max: int, act: str = 'relu') -> None:
        super().__init__()
        self.k = LQE_TOP_K
        self.reg_max = reg_max
        self.reg_conf = MLP(4 * (self.k + 1), LQE_HIDDEN, 1, LQE_LAYERS, act)
        nn.init.constant_(self.reg_conf.layers[-1].weight, 0)
        nn.init.constant_(self.reg_conf.layers[-1].bias, 0)

    def forward(self, scores: Tensor, corners: Tensor) -> Tensor:
        bs, num_queries = corners.shape[:2]
        prob = F.softmax(
            corners.reshape(bs, num_queries, 4, self.reg_max + 1), dim=-1)
        top = prob.topk(self.k, dim=-1)[0]
        stat = torch.cat([top, top.mean(-1, keepdim=True)], -1)
        return scores + self.reg_conf(stat.reshape(bs, num_queries, -1))


class DFINEDecoder(nn.Module):
    """Decoder with fine-grained distribution refinement (upstream
    ``TransformerDecoder``).

    Layer 0 predicts a plain box (``pre_bbox_head``, refining the selected
    encoder boxes) that becomes every layer's reference box
    (``ref_points_initial``, detached). Every layer ``i`` then predicts
    the logits of four edge distributions over ``reg_max + 1`` bins with
    ``reg_branches[i]``, *added to* layer ``i - 1``'s (residual
    refinement, not detached); its box is the reference box moved by the
    integral of those distributions (:func:`distance2bbox`). The next
    layer attends around this box, detached. Class scores are
    ``cls_branches[i]`` plus the :class:`LQE` term.

    Layers after ``eval_idx`` can be wider (``layer_scale``): query,
    position embedding and values are widened by nearest interpolation.
    In eval mode the loop stops after ``eval_idx``.

    ``up`` and ``reg_scale`` are buffers (upstream: parameters with
    ``requires_grad=False``) because checkpoints carry them; the bin values
    ``W(n)`` are rebuilt only when they change (their version counters).

    Args:
        num_layers (int): Decoder layers.
        layer_cfg (dict): Keyword arguments of :class:`DFINEDecoderLayer`
            (``embed_dims``, ``num_heads``, ``feedforward_channels``,
            ``dropout``, ``activation``, ``num_levels``, ``num_points``).
        eval_idx (int): Last layer run in eval mode; negative counts from
            the end. Defaults to -1.
        layer_scale (float): Width multiplier of the layers after
            ``eval_idx``. Defaults to 1.
        reg_max (int): Index of the last bin. Defaults to 32.
        reg_scale (float): Curvature of the weighting function (4; 8 for
            D-FINE-X). Defaults to 4.0.
        up (float): Upper-bound factor of the weighting function.
            Defaults to 0.5.
    """

    def __init__(self,
                 num_layers: int,
                 layer_cfg: dict,
                 eval_idx: int = -1,
                 layer_scale: float = 1,
                 reg_max: int = 32,
                 reg_scale: float = 4.0,
                 up: float = 0.5) -> None:
        super().__init__()
        if not -num_layers <= eval_idx < num_layers:
            raise ValueError(
                f'DFINE decoder.eval_idx must be in [-{num_layers}, '
                f'{num_layers - 1}] for decoder.num_layers={num_layers}, '
                f'but got {eval_idx}. Use -1 for the last layer.')
        if reg_max < 4 or reg_max % 2:
            raise ValueError(
                'DFINE decoder.reg_max must be an even number >= 4 (the '
                f'bins are symmetric around 0), but got {reg_max}; '
                'upstream uses 32.')
        self.num_layers = num_layers
        self.eval_idx = eval_idx % num_layers
        self.layer_scale = layer_scale
        self.reg_max = reg_max
        self.num_heads = layer_cfg.get('num_heads', 8)
        self.layers = nn.ModuleList(
            DFINEDecoderLayer(**layer_cfg) if i <= self.eval_idx else
            DFINEDecoderLayer(**layer_cfg, layer_scale=layer_scale)
            for i in range(num_layers))
        activation = layer_cfg.get('activation', 'relu')
        self.lqe_layers = nn.ModuleList(
            LQE(reg_max, activation) for _ in range(num_layers))
        self.register_buffer('up', torch.tensor([float(up)]))
        self.register_buffer('reg_scale', torch.tensor([float(reg_scale)]))

    def project(self) -> Tensor:
        """The bin values ``W(0..reg_max)`` (:func:`weighting_function`),
        made again only after ``up`` or ``reg_scale`` is written, replaced
        or moved."""
        return cached_until_written(
            self, '_project_cache', (self.up, self.reg_scale),
            lambda: weighting_function(self.reg_max, self.up, self.reg_scale))

    def forward(self, query: Tensor, reference_points: Tensor, memory: Tensor,
                level_shapes: Sequence[Tuple[int, int]],
                attn_mask: Optional[Tensor], bbox_head: nn.Module,
                query_pos_head: nn.Module) -> Dict[str, Tensor]:
        """Run the layers.

        Args:
            query (Tensor): Content queries, (bs, num_queries, dims).
            reference_points (Tensor): Unactivated boxes, (bs, num_queries,
                4).
            memory (Tensor): Flattened levels, (bs, num_tokens, dims).
            level_shapes (Sequence[tuple]): (H, W) per level.
            attn_mask (Tensor, optional): Self-attention mask (dn groups).
            bbox_head (nn.Module): Holds ``cls_branches``,
                ``reg_branches`` (one per layer) and ``pre_bbox_head``.
            query_pos_head (nn.Module): Box to position embedding.

        Returns:
            dict: ``layers_scores`` (num_run, bs, num_queries, classes),
            ``layers_boxes`` (num_run, bs, num_queries, 4) (cx, cy, w, h),
            and in training also ``layers_corners`` (num_layers, bs,
            num_queries, 4 * (reg_max + 1)), ``ref_boxes`` (bs,
            num_queries, 4), ``pre_scores`` and ``pre_boxes``. ``num_run``
            is ``num_layers`` in training and 1 (layer ``eval_idx``) in
            eval mode.
        """
        project = self.project()
        value = self._split_value(memory, level_shapes)
        ref_boxes_detached = reference_points.sigmoid()
        output_detached = corners_before = 0
        scores_list, boxes_list, corners_list = [], [], []
        extras = {}
        for i, layer in enumerate(self.layers):
            query_pos = query_pos_head(ref_boxes_detached).clamp(
                min=-QUERY_POS_LIMIT, max=QUERY_POS_LIMIT)
            if i > self.eval_idx and self.layer_scale > 1:
                query_pos = F.interpolate(
                    query_pos, scale_factor=self.layer_scale)
                width = query_pos.shape[-1]
                value = self._split_value(
                    F.interpolate(memory, size=width), level_shapes)
                query = F.interpolate(query, size=width)
                output_detached = query.detach()
            query = layer(query, ref_boxes_detached[:, :, None], value,
                          level_shapes, attn_mask, query_pos)
            if i == 0:
                ref_boxes = bbox_head.pre_bbox_head(query) + inverse_sigmoid(
                    ref_boxes_detached, eps=INVERSE_SIGMOID_EPS)
                ref_boxes = ref_boxes.sigmoid()
                if self.training:
                    extras.update(
                        pre_boxes=ref_boxes,
                        pre_scores=bbox_head.cls_branches[0](query))
                ref_boxes = ref_boxes.detach()
            corners = bbox_head.reg_branches[i](
                query + output_detached) + corners_before
            boxes = distance2bbox(ref_boxes, integral(corners, project),
                                  self.reg_scale)
            if self.training or i == self.eval_idx:
                scores = self.lqe_layers[i](bbox_head.cls_branches[i](query),
                                            corners)
                scores_list.append(scores)
                boxes_list.append(boxes)
                corners_list.append(corners)
                if not self.training:
                    break
            corners_before = corners
            ref_boxes_detached = boxes.detach()
            output_detached = query.detach()
        outputs = dict(
            layers_scores=torch.stack(scores_list),
            layers_boxes=torch.stack(boxes_list))
        if self.training:
            outputs.update(
                layers_corners=torch.stack(corners_list),
                ref_boxes=ref_boxes,
                **extras)
        return outputs

    def _split_value(self, memory: Tensor,
                     level_shapes: Sequence[Tuple[int, int]]) -> List[Tensor]:
        """Per-level value maps (bs * num_heads, head_dims, H, W) of the
        flattened memory."""
        bs, num_tokens, dims = memory.shape
        value = memory.reshape(bs, num_tokens, self.num_heads, -1)
        value = value.permute(0, 2, 3, 1)
        sizes = [h * w for h, w in level_shapes]
        # One contiguous copy per level: grid_sample reads a contiguous map
        # about twice as fast as a strided view of the whole memory.
        return [
            level.reshape(bs * self.num_heads, -1, h, w)
            for level, (h, w) in zip(value.split(sizes, -1), level_shapes)
        ]
