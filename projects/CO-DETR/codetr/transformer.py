"""The CO-DINO transformer: encoder, decoder and the module that joins them.

Built from mmcv's transformer bricks (``BaseTransformerLayer``,
``TransformerLayerSequence``, ``MultiScaleDeformableAttention``), which is
what upstream CO-DETR uses, so every parameter keeps upstream's name and
shape (``query_head.transformer.encoder.layers.N.attentions.0...``).
"""
import functools
import math
from typing import Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.utils.checkpoint as torch_checkpoint
from mmcv.cnn.bricks.transformer import (TransformerLayerSequence,
                                         build_transformer_layer_sequence)
from mmcv.ops import MultiScaleDeformableAttention
from mmdet.models.layers.transformer import inverse_sigmoid
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor


def _run_encoder_layer(layer: nn.Module, query: Tensor, query_pos: Tensor,
                       padding_mask: Tensor, spatial_shapes: Tensor,
                       reference_points: Tensor, level_start_index: Tensor,
                       valid_ratios: Tensor) -> Tensor:
    """One encoder layer with every tensor passed positionally, which is
    what a (reentrant or not) activation checkpoint needs."""
    return layer(
        query,
        None,
        None,
        query_pos=query_pos,
        query_key_padding_mask=padding_mask,
        spatial_shapes=spatial_shapes,
        reference_points=reference_points,
        level_start_index=level_start_index,
        valid_ratios=valid_ratios)


@MODELS.register_module(name='DetrTransformerEncoder')
@MODELS.register_module()
class CoDetrTransformerEncoder(TransformerLayerSequence):
    """Deformable DETR encoder with activation checkpointing through
    ``torch.utils.checkpoint``.

    Replaces upstream CO-DETR's ``DetrTransformerEncoder``, which wraps its
    first ``with_cp`` layers in fairscale's reentrant
    ``checkpoint_wrapper``. Here the same key checkpoints the same layers
    with ``torch.utils.checkpoint.checkpoint`` and leaves the reentrancy
    flag unstated, so mmddp_ext's ``CheckpointConflictHook`` policy (which
    applies to every checkpoint call that does not state it) can make it
    non-reentrant, as DDP with unused parameters needs. Checkpointing only
    runs in training
    with grad enabled; parameter names are those of upstream. Also
    registered under upstream's type name ``DetrTransformerEncoder`` (with
    upstream's arguments), so upstream's CO-DINO configs build unchanged.

    Args:
        transformerlayers (dict | list[dict]): Config of the
            ``BaseTransformerLayer`` s, as in ``TransformerLayerSequence``.
        num_layers (int): Number of layers.
        with_cp (int): Number of leading layers whose activations are
            recomputed in backward; 0 or negative switches it off.
            Defaults to -1.
        post_norm_cfg (dict, optional): Accepted for upstream config
            compatibility; upstream only builds this norm for pre-norm
            layers, which CO-DETR does not use. Must be None or the layers
            must be post-norm. Defaults to dict(type='LN').
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 *args,
                 with_cp: int = -1,
                 post_norm_cfg: Optional[dict] = dict(type='LN'),
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not isinstance(with_cp, int) or with_cp > self.num_layers:
            raise ValueError(
                'CoDetrTransformerEncoder: encoder.with_cp is the number of '
                f'layers to checkpoint, an int in [-1, {self.num_layers}] '
                f'(encoder.num_layers), but got {with_cp!r}. Set it to '
                f'{self.num_layers} to checkpoint every layer or -1 for none.')
        if self.pre_norm:
            raise ValueError(
                'CoDetrTransformerEncoder: CO-DETR encoder layers are '
                "post-norm (operation_order ('self_attn', 'norm', 'ffn', "
                "'norm')), but got a pre-norm operation_order. Use the "
                'post-norm order.')
        # Stored as 0 when off: mmddp_ext reads a falsy with_cp as 'off'.
        self.with_cp = max(with_cp, 0)

    def forward(self, query: Tensor, key: None, value: None, query_pos: Tensor,
                query_key_padding_mask: Tensor, spatial_shapes: Tensor,
                reference_points: Tensor, level_start_index: Tensor,
                valid_ratios: Tensor, **kwargs) -> Tensor:
        """Encode the flattened multi-level features.

        Args:
            query (Tensor): Flattened features, (num_keys, bs, embed_dims).
            key, value (None): Unused (self-attention on ``query``).
            query_pos (Tensor): Positional + level embeddings, same shape
                as ``query``.
            query_key_padding_mask (Tensor): (bs, num_keys), True on
                padding.
            spatial_shapes (Tensor): (num_levels, 2) feature map sizes.
            reference_points (Tensor): (bs, num_keys, num_levels, 2).
            level_start_index (Tensor): (num_levels, ) start of each level.
            valid_ratios (Tensor): (bs, num_levels, 2).

        Returns:
            Tensor: The memory, (num_keys, bs, embed_dims).
        """
        inputs = (query_pos, query_key_padding_mask, spatial_shapes,
                  reference_points, level_start_index, valid_ratios)
        for index, layer in enumerate(self.layers):
            run = functools.partial(_run_encoder_layer, layer)
            if index < self.with_cp and self.training and \
                    torch.is_grad_enabled():
                # Reentrancy left unstated: CheckpointConflictHook's
                # policy decides it.
                query = torch_checkpoint.checkpoint(run, query, *inputs)
            else:
                query = run(query, *inputs)
        return query


def coordinate_sine_embedding(coords: Tensor,
                              num_feats: int,
                              temperature: int = 10000) -> Tensor:
    """Sine/cosine embedding of each of the last-axis coordinates in [0, 1].

    Args:
        coords (Tensor): (..., num_coords) coordinates.
        num_feats (int): Features per coordinate (even).
        temperature (int): Frequency base. Defaults to 10000.

    Returns:
        Tensor: (..., num_coords * num_feats), the coordinates in order,
        each as interleaved (sin, cos) pairs.
    """
    dim_t = torch.arange(num_feats, dtype=torch.float32, device=coords.device)
    dim_t = temperature**(2 * (dim_t // 2) / num_feats)
    pos = coords[..., None] * (2 * math.pi) / dim_t
    pos = torch.stack((pos[..., 0::2].sin(), pos[..., 1::2].cos()), dim=-1)
    return pos.flatten(-2).flatten(-2)


@MODELS.register_module(name='DinoTransformerDecoder')
@MODELS.register_module()
class CoDinoTransformerDecoder(TransformerLayerSequence):
    """DINO decoder with look-forward-twice box refinement.

    Same parameters as upstream CO-DETR's ``DinoTransformerDecoder``
    (``ref_point_head`` MLP ``2 * embed_dims -> embed_dims -> embed_dims``
    and a final ``norm``). The query position comes from the sine
    embedding of the reference box with ``embed_dims // 2`` features per
    coordinate (128 for the 256-d model, as upstream), so narrower models
    work too. The reference order is (y, x, w, h), as upstream. Also
    registered under upstream's type name ``DinoTransformerDecoder``.

    Args:
        transformerlayers (dict | list[dict]): Config of the decoder
            ``BaseTransformerLayer`` s (self-attention, norm, deformable
            cross-attention, norm, FFN, norm).
        num_layers (int): Number of layers.
        return_intermediate (bool): Accepted for upstream config
            compatibility; the CO-DINO head needs every layer's output, so
            it must be True. Defaults to True.
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 *args,
                 return_intermediate: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not return_intermediate:
            raise ValueError(
                'CoDinoTransformerDecoder: decoder.return_intermediate must '
                'be True (the head supervises every decoder layer), but got '
                'False. Remove the key or set it to True.')
        self.return_intermediate = return_intermediate
        self.ref_point_head = nn.Sequential(
            nn.Linear(self.embed_dims * 2, self.embed_dims), nn.ReLU(),
            nn.Linear(self.embed_dims, self.embed_dims))
        self.norm = nn.LayerNorm(self.embed_dims)

    def query_position(self, reference_points: Tensor) -> Tensor:
        """Query positional embedding of (bs, nq, 4) boxes, (nq, bs, E)."""
        cx, cy, w, h = reference_points.unbind(-1)
        coords = torch.stack((cy, cx, w, h), dim=-1)
        sine = coordinate_sine_embedding(coords, self.embed_dims // 2)
        return self.ref_point_head(sine).permute(1, 0, 2)

    def forward(self,
                query: Tensor,
                value: Tensor,
                reference_points: Tensor,
                valid_ratios: Tensor,
                reg_branches: nn.ModuleList,
                self_attn_mask: Optional[Tensor] = None,
                **kwargs) -> Tuple[Tensor, Tensor]:
        """Decode the queries, refining their boxes layer by layer.

        Args:
            query (Tensor): (num_queries, bs, embed_dims).
            value (Tensor): Encoder memory, (num_keys, bs, embed_dims).
            reference_points (Tensor): Initial boxes, normalized (cx, cy,
                w, h), (bs, num_queries, 4).
            valid_ratios (Tensor): (bs, num_levels, 2).
            reg_branches (nn.ModuleList): Box refinement branch per layer.
            self_attn_mask (Tensor, optional): Self-attention mask, True
                where attention is not allowed. Defaults to None.
            **kwargs: ``key_padding_mask``, ``spatial_shapes``,
                ``level_start_index`` for the cross-attention.

        Returns:
            tuple[Tensor]: Normalized outputs of every layer, (num_layers,
            num_queries, bs, embed_dims), and the references used to
            decode them, (num_layers + 1, bs, num_queries, 4): the initial
            boxes, then each layer's refined (not detached) boxes.
        """
        output = query
        intermediate, references = [], [reference_points]
        scale = torch.cat([valid_ratios, valid_ratios], -1)[:, None]
        for index, layer in enumerate(self.layers):
            points_input = reference_points[:, :, None] * scale
            output = layer(
                output,
                None,
                value,
                query_pos=self.query_position(points_input[:, :, 0]),
                attn_masks=[self_attn_mask, None],
                reference_points=points_input,
                **kwargs)
            delta = reg_branches[index](output.permute(1, 0, 2))
            refined = (delta +
                       inverse_sigmoid(reference_points, eps=1e-3)).sigmoid()
            reference_points = refined.detach()
            intermediate.append(self.norm(output))
            references.append(refined)
        return torch.stack(intermediate), torch.stack(references)


@MODELS.register_module()
class CoDinoTransformer(BaseModule):
    """Encoder, two-stage query selection, decoder, and the auxiliary
    query path of CO-DINO.

    Same parameters (names and shapes) as upstream CO-DETR's
    ``CoDinoTransformer``: ``level_embeds``, ``enc_output``,
    ``enc_output_norm``, ``query_embed`` (content queries), and per
    auxiliary head ``aux_pos_trans`` / ``aux_pos_trans_norm`` (plus
    ``pos_feats_trans`` / ``pos_feats_norm`` when ``with_coord_feat``).

    Args:
        encoder (dict): Config of :class:`CoDetrTransformerEncoder`.
        decoder (dict): Config of :class:`CoDinoTransformerDecoder`.
        num_feature_levels (int): Number of feature levels. Defaults to 4.
        two_stage_num_proposals (int): Number of matching queries (set by
            the head from its ``num_query``). Defaults to 900.
        num_co_heads (int): Number of auxiliary heads whose positive boxes
            become extra query groups. Defaults to 1.
        with_coord_feat (bool): Add the auxiliary heads' features to their
            queries. Defaults to True (CO-DINO configs set False).
        as_two_stage (bool): Accepted for upstream config compatibility;
            must be True. Defaults to True.
        mixed_selection (bool): Accepted for upstream config
            compatibility (CO-DINO always selects positions from the
            encoder and uses learnt content queries). Defaults to True.
        with_pos_coord (bool): Build the auxiliary query layers. Defaults
            to True.
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 encoder: dict,
                 decoder: dict,
                 num_feature_levels: int = 4,
                 two_stage_num_proposals: int = 900,
                 num_co_heads: int = 1,
                 with_coord_feat: bool = True,
                 as_two_stage: bool = True,
                 mixed_selection: bool = True,
                 with_pos_coord: bool = True,
                 init_cfg: Optional[dict] = None) -> None:
        super().__init__(init_cfg=init_cfg)
        if not as_two_stage:
            raise ValueError(
                'CoDinoTransformer: transformer.as_two_stage must be True '
                '(DINO selects its queries from the encoder), but got False.')
        self.encoder = build_transformer_layer_sequence(encoder)
        self.decoder = build_transformer_layer_sequence(decoder)
        self.embed_dims = self.encoder.embed_dims
        self.num_feature_levels = num_feature_levels
        self.two_stage_num_proposals = two_stage_num_proposals
        self.num_co_heads = num_co_heads if with_pos_coord else 0
        self.with_coord_feat = with_coord_feat
        self.as_two_stage = True
        dims = self.embed_dims
        self.level_embeds = nn.Parameter(torch.empty(num_feature_levels, dims))
        self.enc_output = nn.Linear(dims, dims)
        self.enc_output_norm = nn.LayerNorm(dims)
        self.query_embed = nn.Embedding(two_stage_num_proposals, dims)
        self.aux_pos_trans = nn.ModuleList()
        self.aux_pos_trans_norm = nn.ModuleList()
        self.pos_feats_trans = nn.ModuleList()
        self.pos_feats_norm = nn.ModuleList()
        for _ in range(self.num_co_heads):
            self.aux_pos_trans.append(nn.Linear(dims * 2, dims))
            self.aux_pos_trans_norm.append(nn.LayerNorm(dims))
            if with_coord_feat:
                self.pos_feats_trans.append(nn.Linear(dims, dims))
                self.pos_feats_norm.append(nn.LayerNorm(dims))

    def init_weights(self) -> None:
        """Xavier for every matrix, mmcv's own init for the deformable
        attentions, normal level and content embeddings (as upstream)."""
        for param in self.parameters():
            if param.dim() > 1:
                nn.init.xavier_uniform_(param)
        for module in self.modules():
            if isinstance(module, MultiScaleDeformableAttention):
                module.init_weights()
        nn.init.normal_(self.level_embeds)
        nn.init.normal_(self.query_embed.weight)
        self._is_init = True

    @staticmethod
    def valid_ratio(mask: Tensor) -> Tensor:
        """(bs, 2) valid (w, h) fraction of a (bs, h, w) padding mask."""
        _, height, width = mask.shape
        valid_h = (~mask[:, :, 0]).sum(1).float() / height
        valid_w = (~mask[:, 0, :]).sum(1).float() / width
        return torch.stack([valid_w, valid_h], -1)

    def flatten_levels(self, mlvl_feats: Sequence[Tensor],
                       mlvl_masks: Sequence[Tensor]) -> dict:
        """Flatten the levels into one key sequence plus its geometry."""
        feats = torch.cat([f.flatten(2).transpose(1, 2) for f in mlvl_feats],
                          1)
        masks = torch.cat([m.flatten(1) for m in mlvl_masks], 1)
        spatial_shapes = torch.as_tensor([f.shape[-2:] for f in mlvl_feats],
                                         dtype=torch.long,
                                         device=feats.device)
        level_start_index = torch.cat((spatial_shapes.new_zeros(
            (1, )), spatial_shapes.prod(1).cumsum(0)[:-1]))
        valid_ratios = torch.stack([self.valid_ratio(m) for m in mlvl_masks],
                                   1)
        return dict(
            feats=feats,
            masks=masks,
            spatial_shapes=spatial_shapes,
            level_start_index=level_start_index,
            valid_ratios=valid_ratios)

    @staticmethod
    def encoder_reference_points(spatial_shapes: Tensor,
                                 valid_ratios: Tensor) -> Tensor:
        """Pixel-centre reference points, (bs, num_keys, num_levels, 2)."""
        points = []
        for level, (height, width) in enumerate(spatial_shapes.tolist()):
            ref_y, ref_x = torch.meshgrid(
                torch.linspace(
                    0.5,
                    height - 0.5,
                    height,
                    dtype=torch.float32,
                    device=valid_ratios.device),
                torch.linspace(
                    0.5,
                    width - 0.5,
                    width,
                    dtype=torch.float32,
                    device=valid_ratios.device),
                indexing='ij')
            ref_y = ref_y.reshape(-1)[None] / (
                valid_ratios[:, None, level, 1] * height)
            ref_x = ref_x.reshape(-1)[None] / (
                valid_ratios[:, None, level, 0] * width)
            points.append(torch.stack((ref_x, ref_y), -1))
        points = torch.cat(points, 1)
        return points[:, :, None] * valid_ratios[:, None]

    def encoder_proposals(self, memory: Tensor, masks: Tensor,
                          spatial_shapes: Tensor) -> Tuple[Tensor, Tensor]:
        """Per-key proposal boxes (inverse-sigmoid space) and the projected
        memory they are scored from, as in Deformable DETR."""
        batch_size = memory.size(0)
        proposals, start = [], 0
        for level, (height, width) in enumerate(spatial_shapes.tolist()):
            level_mask = masks[:, start:start + height * width].view(
                batch_size, height, width)
            valid_h = (~level_mask[:, :, 0]).sum(1)
            valid_w = (~level_mask[:, 0, :]).sum(1)
            grid_y, grid_x = torch.meshgrid(
                torch.linspace(
                    0,
                    height - 1,
                    height,
                    dtype=torch.float32,
                    device=memory.device),
                torch.linspace(
                    0,
                    width - 1,
                    width,
                    dtype=torch.float32,
                    device=memory.device),
                indexing='ij')
            grid = torch.stack([grid_x, grid_y], -1)
            valid = torch.stack([valid_w, valid_h],
                                -1).view(batch_size, 1, 1, 2)
            grid = (grid[None].expand(batch_size, -1, -1, -1) + 0.5) / valid
            wh = torch.ones_like(grid) * 0.05 * (2.0**level)
            proposals.append(torch.cat((grid, wh), -1).view(batch_size, -1, 4))
            start += height * width
        proposals = torch.cat(proposals, 1)
        inside = ((proposals > 0.01) & (proposals < 0.99)).all(
            -1, keepdim=True)
        proposals = torch.log(proposals / (1 - proposals))
        proposals = proposals.masked_fill(masks.unsqueeze(-1), float('inf'))
        proposals = proposals.masked_fill(~inside, float('inf'))
        memory = memory.masked_fill(masks.unsqueeze(-1), 0.0)
        memory = memory.masked_fill(~inside, 0.0)
        return self.enc_output_norm(self.enc_output(memory)), proposals

    def forward(self,
                mlvl_feats: Sequence[Tensor],
                mlvl_masks: Sequence[Tensor],
                mlvl_pos_embeds: Sequence[Tensor],
                reg_branches: nn.ModuleList,
                cls_branches: nn.ModuleList,
                dn_label_query: Optional[Tensor] = None,
                dn_bbox_query: Optional[Tensor] = None,
                attn_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        """Encode, select the top-k encoder proposals, decode.

        Args:
            mlvl_feats (list[Tensor]): (bs, embed_dims, h, w) per level.
            mlvl_masks (list[Tensor]): (bs, h, w) padding masks.
            mlvl_pos_embeds (list[Tensor]): (bs, embed_dims, h, w).
            reg_branches (nn.ModuleList): The head's box branches; the
                last one scores the encoder proposals.
            cls_branches (nn.ModuleList): The head's class branches,
                likewise.
            dn_label_query (Tensor, optional): (bs, num_dn, embed_dims)
                denoising content queries. Defaults to None.
            dn_bbox_query (Tensor, optional): (bs, num_dn, 4) denoising
                boxes (inverse-sigmoid space). Defaults to None.
            attn_mask (Tensor, optional): Decoder self-attention mask.
                Defaults to None.

        Returns:
            tuple[Tensor]: decoder states (num_layers, nq, bs, E),
            references (num_layers + 1, bs, nq, 4), top-k encoder scores
            (bs, num_query, cls), top-k encoder boxes (bs, num_query, 4,
            sigmoid), memory (bs, num_keys, E).
        """
        flat = self.flatten_levels(mlvl_feats, mlvl_masks)
        pos = torch.cat([
            p.flatten(2).transpose(1, 2) +
            self.level_embeds[level].view(1, 1, -1)
            for level, p in enumerate(mlvl_pos_embeds)
        ], 1)
        memory = self.encoder(
            flat['feats'].permute(1, 0, 2),
            None,
            None,
            query_pos=pos.permute(1, 0, 2),
            query_key_padding_mask=flat['masks'],
            spatial_shapes=flat['spatial_shapes'],
            reference_points=self.encoder_reference_points(
                flat['spatial_shapes'], flat['valid_ratios']),
            level_start_index=flat['level_start_index'],
            valid_ratios=flat['valid_ratios']).permute(1, 0, 2)
        batch_size = memory.size(0)

        output_memory, proposals = self.encoder_proposals(
            memory, flat['masks'], flat['spatial_shapes'])
        num_layers = self.decoder.num_layers
        enc_class = cls_branches[num_layers](output_memory)
        enc_coord = reg_branches[num_layers](output_memory) + proposals
        topk = torch.topk(
            enc_class.max(-1)[0], self.two_stage_num_proposals, dim=1)[1]
        topk_score = torch.gather(
            enc_class, 1,
            topk.unsqueeze(-1).expand(-1, -1, enc_class.size(-1)))
        topk_coords = torch.gather(enc_coord, 1,
                                   topk.unsqueeze(-1).expand(-1, -1, 4))
        topk_anchor = topk_coords.sigmoid()
        topk_coords = topk_coords.detach()

        query = self.query_embed.weight[None].expand(batch_size, -1, -1)
        reference = topk_coords
        if dn_label_query is not None:
            query = torch.cat([dn_label_query, query], dim=1)
            reference = torch.cat([dn_bbox_query, topk_coords], dim=1)
        states, references = self.decoder(
            query.permute(1, 0, 2),
            memory.permute(1, 0, 2),
            reference_points=reference.sigmoid(),
            valid_ratios=flat['valid_ratios'],
            reg_branches=reg_branches,
            self_attn_mask=attn_mask,
            key_padding_mask=flat['masks'],
            spatial_shapes=flat['spatial_shapes'],
            level_start_index=flat['level_start_index'])
        return states, references, topk_score, topk_anchor, memory

    def forward_aux(self,
                    mlvl_feats: Sequence[Tensor],
                    mlvl_masks: Sequence[Tensor],
                    pos_anchors: Tensor,
                    reg_branches: nn.ModuleList,
                    head_idx: int,
                    pos_feats: Optional[Tensor] = None,
                    attn_mask: Optional[Tensor] = None) -> Tuple[Tensor, ...]:
        """Decode the positive boxes of auxiliary head ``head_idx`` as
        extra queries against the encoder output.

        Args:
            mlvl_feats (list[Tensor]): Encoder memory per level,
                (bs, embed_dims, h, w).
            mlvl_masks (list[Tensor]): (bs, h, w) padding masks.
            pos_anchors (Tensor): (bs, n, 4) normalized (cx, cy, w, h).
            reg_branches (nn.ModuleList): The head's box branches.
            head_idx (int): Index of the auxiliary head.
            pos_feats (Tensor, optional): (bs, n, embed_dims), used when
                ``with_coord_feat``. Defaults to None.
            attn_mask (Tensor, optional): Self-attention mask. Defaults to
                None.

        Returns:
            tuple[Tensor]: decoder states and references, as ``forward``.
        """
        flat = self.flatten_levels(mlvl_feats, mlvl_masks)
        sine = coordinate_sine_embedding(
            inverse_sigmoid(pos_anchors).sigmoid(), self.embed_dims // 2)
        query = self.aux_pos_trans_norm[head_idx](
            self.aux_pos_trans[head_idx](sine))
        if self.with_coord_feat:
            query = query + self.pos_feats_norm[head_idx](
                self.pos_feats_trans[head_idx](pos_feats))
        return self.decoder(
            query.permute(1, 0, 2),
            flat['feats'].permute(1, 0, 2),
            reference_points=pos_anchors,
            valid_ratios=flat['valid_ratios'],
            reg_branches=reg_branches,
            self_attn_mask=attn_mask,
            key_padding_mask=flat['masks'],
            spatial_shapes=flat['spatial_shapes'],
            level_start_index=flat['level_start_index'])
