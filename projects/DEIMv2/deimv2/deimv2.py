"""DEIMv2 as an MMDetection detector built on the D-FINE port."""
from collections import OrderedDict

import torch
from mmdet.models.detectors import DeformableDETR
from mmdet.registry import MODELS
from torch import nn

from .deimv2_decoder_layers import DEIMv2Decoder
from .ports import DFINE, MLP


@MODELS.register_module()
class DEIMv2(DFINE):
    """DEIMv2 (Intellindust-AI-Lab/DEIMv2) on the D-FINE port: upstream's
    ``DEIMTransformer`` of ``engine/deim/deim_decoder.py``.

    Differs from :class:`DFINE` in ``_init_layers`` (the modules it builds)
    and ``init_weights``; query selection, denoising (DDP-safe on batches
    without GT) and the decoder loop are D-FINE's:

    - the decoder is :class:`DEIMv2Decoder` (RMSNorm, SwiGLU FFN,
      optional gateway; one query position embedding for every layer);
    - the query position head is ``MLP(4, dims, dims, 3)`` (D-FINE:
      ``MLP(4, 2 * dims, dims, 2)``);
    - there is no ``enc_output`` projection: the encoder heads score the
      masked memory itself (upstream has none);
    - the input projections are D-FINE's, and extra levels (more
      ``num_feature_levels`` than backbone levels) are not supported, as
      no DEIMv2 config uses them.

    Args:
        decoder (dict): Keys of :class:`DEIMv2Decoder` (``num_layers``,
            ``eval_idx``, ``reg_max``, ``reg_scale``, ``up``,
            ``lqe_act``, ``layer_cfg``). Required.
        **kwargs: Keys of :class:`DFINE` (``mlp_act``, ``backbone``,
            ``neck``, ``bbox_head``, ``dn_cfg``, ``num_queries``,
            ``num_feature_levels``, ``feat_channels``, ...).
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def _init_layers(self) -> None:
        """Replaces ``DFINE._init_layers``: D-FINE's input projection (1x1
        conv + BN where the channels differ), DEIMv2's decoder and query
        position head, and no ``enc_output`` (see the class doc)."""
        self.embed_dims = self.decoder['layer_cfg'].get('embed_dims', 256)
        dims = self.embed_dims
        feat_channels = self.feat_channels or [dims] * self.num_feature_levels
        if len(feat_channels) != self.num_feature_levels:
            raise ValueError(
                f'DEIMv2 feat_channels ({list(feat_channels)}) must list '
                f'num_feature_levels={self.num_feature_levels} widths, one '
                'per neck output level.')
        self.input_proj = nn.ModuleList(
            nn.Identity() if channels == dims else nn.Sequential(
                OrderedDict(
                    conv=nn.Conv2d(channels, dims, 1, bias=False),
                    norm=nn.BatchNorm2d(dims))) for channels in feat_channels)
        self.decoder = DEIMv2Decoder(**self.decoder)
        self.query_pos_head = MLP(4, dims, dims, 3, self.mlp_act)
        self.enc_output = nn.Identity()

    def init_weights(self) -> None:
        """``DFINE.init_weights`` without ``enc_output`` (DEIMv2 has
        none): children init themselves, xavier for the query position
        head and the input projection convs, N(0, 1) for the dn class
        embedding (padding row 0)."""
        super(DeformableDETR, self).init_weights()
        for layer in self.query_pos_head.layers:
            nn.init.xavier_uniform_(layer.weight)
        for proj in self.input_proj:
            if isinstance(proj, nn.Sequential):
                nn.init.xavier_uniform_(proj.conv.weight)
        embedding = self.dn_query_generator.label_embedding.weight
        with torch.no_grad():
            nn.init.normal_(embedding[:-1])
            embedding[-1].zero_()
