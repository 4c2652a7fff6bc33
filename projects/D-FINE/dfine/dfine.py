"""D-FINE as an MMDetection detector built on the RT-DETR port."""
from collections import OrderedDict
from typing import Dict, Optional, Tuple

import torch
from mmdet.models.detectors import DeformableDETR
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList
from torch import Tensor, nn

from .dfine_cdn_query_generator import DFINECdnQueryGenerator
from .dfine_decoder_layers import MLP, DFINEDecoder
from .ports import RTDETR

# Keys of model.decoder that the head needs too; DFINE passes them on.
HEAD_KEYS_FROM_DECODER = ('reg_max', 'eval_idx', 'layer_scale')


@MODELS.register_module()
class DFINE(RTDETR):
    """D-FINE (Peterande/D-FINE) on the RT-DETR port's pipeline.

    Backbone (:class:`HGNetv2`) and neck (:class:`DFINEHybridEncoder`) run
    first; this class is upstream's ``DFINETransformer``:

    - ``pre_transformer``: per-level input projection (1x1 conv + BN, or
      none where the level already has ``embed_dims`` channels, as
      upstream) and flattening;
    - ``pre_decoder``: RT-DETR's IoU-aware query selection (anchors,
      ``enc_output``, the encoder class head on every token, top-k), the
      encoder box head on the selected tokens only (as upstream), and in
      training the DDP-safe dn queries (:class:`DFINECdnQueryGenerator`:
      upstream's noise; the dummy group on a batch without GT, where
      upstream has no dn queries and leaves the class embedding unused);
    - ``forward_decoder``: :class:`DFINEDecoder` (fine-grained
      distribution refinement, LQE, ``layer_scale``), whose outputs go to
      :class:`DFINEHead`.

    Differs from :class:`RTDETR` in ``_init_layers`` / ``init_weights``
    (the modules above), ``_ddp_safe_generator``, ``pre_decoder`` and
    ``forward_decoder``.

    Args:
        decoder (dict): ``num_layers`` (int), ``eval_idx`` (int, default
            -1), ``layer_scale`` (float, default 1), ``reg_max`` (int,
            default 32), ``reg_scale`` (float, default 4.0; 8 for
            D-FINE-X), ``up`` (float, default 0.5) and ``layer_cfg``
            (dict of :class:`DFINEDecoderLayer`: ``embed_dims``,
            ``num_heads``, ``feedforward_channels``, ``dropout``,
            ``activation`` ('relu'; DEIM 'silu'), ``num_levels``,
            ``num_points`` (int or one per level, e.g. [3, 6, 3])).
            ``reg_max``, ``eval_idx`` and ``layer_scale`` are passed on to
            the head. Required.
        mlp_act (str): Activation of the MLPs (query position head, box
            heads; upstream ``mlp_act``, 'relu'; DEIM 'silu'); passed on
            to the head. Defaults to 'relu'.
        **kwargs: Keys of :class:`RTDETR` (``num_feature_levels``,
            ``feat_channels``, ``anchor_eps``, ``dn_cfg``, ``backbone``,
            ``neck``, ``bbox_head``, ``num_queries``, ``train_cfg``,
            ``test_cfg``, ...).
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self,
                 *args,
                 decoder: dict,
                 mlp_act: str = 'relu',
                 bbox_head: Optional[dict] = None,
                 **kwargs) -> None:
        self.mlp_act = mlp_act
        if bbox_head is not None:
            given = [
                k for k in HEAD_KEYS_FROM_DECODER + ('mlp_act', )
                if k in bbox_head
            ]
            if given:
                raise ValueError(
                    f'DFINE sets bbox_head.{given[0]} from the detector '
                    f'(model.decoder / model.mlp_act); remove {given} from '
                    'model.bbox_head and set them there instead.')
            bbox_head = dict(
                bbox_head,
                mlp_act=mlp_act,
                **{
                    k: decoder[k]
                    for k in HEAD_KEYS_FROM_DECODER if k in decoder
                })
        super().__init__(*args, decoder=decoder, bbox_head=bbox_head, **kwargs)

    def _init_layers(self) -> None:
        """Replaces ``RTDETR._init_layers``: input projection only where
        the channels differ, :class:`DFINEDecoder`, query position head and
        the query-selection projection (upstream names)."""
        self.embed_dims = self.decoder['layer_cfg'].get('embed_dims', 256)
        dims = self.embed_dims
        feat_channels = self.feat_channels or [dims] * self.num_feature_levels
        self.input_proj = nn.ModuleList(
            nn.Identity() if channels == dims else nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(channels, dims, 1, bias=False),
                    norm=nn.BatchNorm2d(dims))) for channels in feat_channels)
        self.decoder = DFINEDecoder(**self.decoder)
        self.query_pos_head = MLP(4, 2 * dims, dims, 2, self.mlp_act)
        self.enc_output = nn.Sequential(
            OrderedDict(proj=nn.Linear(dims, dims), norm=nn.LayerNorm(dims)))

    def _ddp_safe_generator(self, dn_cfg: dict) -> DFINECdnQueryGenerator:
        """Replaces ``RTDETR._ddp_safe_generator``: D-FINE's noisy
        boxes."""
        return DFINECdnQueryGenerator(**dict(
            dn_cfg,
            num_classes=self.bbox_head.num_classes,
            embed_dims=self.embed_dims,
            num_matching_queries=self.num_queries))

    def init_weights(self) -> None:
        """Replaces ``RTDETR.init_weights`` with upstream's scheme:
        children init themselves (the head: class priors, zero last box
        layers; the decoder layers at construction), xavier for
        ``enc_output``, the query position head and the input projection
        convs, N(0, 1) for the dn class embedding (padding row 0)."""
        super(DeformableDETR, self).init_weights()
        nn.init.xavier_uniform_(self.enc_output.proj.weight)
        for layer in self.query_pos_head.layers:
            nn.init.xavier_uniform_(layer.weight)
        for proj in self.input_proj:
            if isinstance(proj, nn.Sequential):
                nn.init.xavier_uniform_(proj.conv.weight)
        embedding = self.dn_query_generator.label_embedding.weight
        with torch.no_grad():
            nn.init.normal_(embedding[:-1])
            embedding[-1].zero_()

    def pre_decoder(
            self,
            memory: Tensor,
            spatial_shapes: Tensor,
            level_start_index: Tensor,
            level_shapes: Tuple[Tuple[int, int]],
            batch_data_samples: OptSampleList = None) -> Tuple[Dict, Dict]:
        """Replaces ``RTDETR.pre_decoder``: the same selection, but the
        encoder box head runs on the ``num_queries`` selected tokens only
        (upstream; RT-DETR's runs it on every token), and the dn outputs
        are upstream D-FINE's."""
        if memory.size(1) < self.num_queries:
            raise ValueError(
                f'DFINE selects num_queries={self.num_queries} of the '
                f'{memory.size(1)} feature tokens (level sizes '
                f'{list(level_shapes)}): too few. Feed larger images or '
                'lower model.num_queries (and model.test_cfg.max_per_img).')
        anchors, valid = self.static_cache.get(
            ('anchors', level_shapes, memory.device, memory.dtype),
            lambda: self.generate_anchors(level_shapes, memory))
        output_memory = self.enc_output(memory * valid.to(memory.dtype))
        num_layers = self.decoder.num_layers
        enc_scores = self.bbox_head.cls_branches[num_layers](output_memory)
        topk = enc_scores.max(-1)[0].topk(self.num_queries, dim=1)[1]

        def gather(x: Tensor) -> Tensor:
            index = topk[..., None].expand(-1, -1, x.size(-1))
            # topk.size(0), not len(topk): a trace (ONNX export) keeps
            # the batch dimension symbolic only through size()
            return x.expand(topk.size(0), -1, -1).gather(1, index)

        topk_memory = gather(output_memory)
        topk_coords_unact = self.bbox_head.reg_branches[num_layers](
            topk_memory) + gather(anchors)
        query = topk_memory.detach()
        reference_points = topk_coords_unact.detach()
        dn_mask, head_inputs = None, dict()
        if self.training:
            dn_label_query, dn_bbox_query, dn_mask, dn_meta = \
                self.dn_query_generator(batch_data_samples)
            query = torch.cat([dn_label_query, query], dim=1)
            reference_points = torch.cat([dn_bbox_query, reference_points],
                                         dim=1)
            head_inputs = dict(
                enc_outputs_class=gather(enc_scores),
                enc_outputs_coord=topk_coords_unact.sigmoid(),
                dn_meta=dn_meta)
        decoder_inputs = dict(
            query=query, reference_points=reference_points, dn_mask=dn_mask)
        return decoder_inputs, head_inputs

    def forward_decoder(self,
                        query: Tensor,
                        memory: Tensor,
                        reference_points: Tensor,
                        level_shapes: Tuple[Tuple[int, int]],
                        dn_mask: Optional[Tensor] = None,
                        **kwargs) -> Dict:
        """Replaces ``RTDETR.forward_decoder``: :class:`DFINEDecoder` on
        unactivated reference boxes; its outputs (and, in training,
        ``up`` / ``reg_scale``) are the head's inputs."""
        outputs = self.decoder(query, reference_points, memory, level_shapes,
                               dn_mask, self.bbox_head, self.query_pos_head)
        if self.training:
            outputs.update(
                up=self.decoder.up, reg_scale=self.decoder.reg_scale)
        return outputs
