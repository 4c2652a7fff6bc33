"""RT-DETRv2 with DEIM's model changes, on the RT-DETR port."""
import importlib

from mmdet.registry import MODELS
from torch import Tensor, nn

_rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
_rtdetr_layers = importlib.import_module(
    'projects.RT-DETR.rtdetr.rtdetr_layers')
_dfine_layers = importlib.import_module(
    'projects.D-FINE.dfine.dfine_decoder_layers')

QUERY_POS_METHODS = ('default', 'as_reg')


class DEIMRTDETRDecoderLayer(_rtdetr_layers.RTDETRDecoderLayer):
    """``RTDETRDecoderLayer`` whose FFN activation is a config key
    (upstream DEIM's ``RTDETRTransformerv2.activation``; 'silu' in every
    DEIM config).

    Args:
        activation (str): 'relu' (RT-DETRv2), 'silu' or 'gelu'. Defaults to
            'relu'.
        **kwargs: Keys of ``RTDETRDecoderLayer``.
    """

    def __init__(self, activation: str = 'relu', **kwargs) -> None:
        super().__init__(**kwargs)
        self.activation = _rtdetr_layers.build_activation(activation)

    def forward(self,
                query: Tensor,
                query_pos: Tensor,
                memory: Tensor,
                reference_points: Tensor,
                spatial_shapes: Tensor,
                level_start_index: Tensor,
                attn_mask=None) -> Tensor:
        """Replaces ``RTDETRDecoderLayer.forward``, which applies
        ``F.relu`` in the FFN: the same steps with ``self.activation``."""
        q = k = query + query_pos
        attn = self.self_attn(
            q, k, query, attn_mask=attn_mask, need_weights=False)[0]
        query = self.norm1(query + self.dropout1(attn))
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


@MODELS.register_module()
class DEIMRTDETR(_rtdetr.RTDETR):
    """RT-DETRv2 as DEIM builds it (``engine/deim/rtdetrv2_decoder.py``):
    ``RTDETR`` with three of DEIM's keys.

    - ``decoder.layer_cfg.activation``: the decoder FFNs'
      (:class:`DEIMRTDETRDecoderLayer`).
    - ``mlp_act``: the activation of the box MLPs (the head's regression
      branches, whose ReLUs are replaced) and of the query position head.
    - ``query_pos_method``: 'as_reg' makes the query position head
      ``MLP(4, dims, dims, 3)`` (upstream: "as the regression head");
      'default' keeps RT-DETR's ``MLP(4, 2 * dims, dims, 2)``. Upstream
      initialises its first two layers with xavier, the third keeps
      PyTorch's default.

    Differs from ``RTDETR._init_layers`` and ``RTDETR.init_weights`` by
    those modules only; the state dict has RT-DETRv2's keys (the 'as_reg'
    head one layer more), so ``tools/convert_rtdetr_checkpoint.py`` maps
    DEIM-RTDETRv2 checkpoints.

    Args:
        mlp_act (str): 'relu' (RT-DETRv2) or 'silu' (DEIM). Defaults to
            'silu'.
        query_pos_method (str): 'default' or 'as_reg' (DEIM). Defaults to
            'as_reg'.
        **kwargs: Keys of ``RTDETR``; ``decoder.layer_cfg`` may hold
            ``activation`` (defaults to 'relu').
    """

    def __init__(self,
                 *args,
                 mlp_act: str = 'silu',
                 query_pos_method: str = 'as_reg',
                 **kwargs) -> None:
        if query_pos_method not in QUERY_POS_METHODS:
            raise ValueError(f'DEIMRTDETR query_pos_method must be one of '
                             f'{QUERY_POS_METHODS} (upstream DEIM), got '
                             f'{query_pos_method!r}.')
        self.mlp_act = mlp_act
        self.query_pos_method = query_pos_method
        super().__init__(*args, **kwargs)

    def _init_layers(self) -> None:
        """``RTDETR._init_layers``, then DEIM's decoder layers, query
        position head and box MLP activation."""
        layer_cfg = dict(self.decoder['layer_cfg'])
        activation = layer_cfg.pop('activation', 'relu')
        self.decoder = dict(self.decoder, layer_cfg=layer_cfg)
        super()._init_layers()
        self.decoder.layers = nn.ModuleList([
            DEIMRTDETRDecoderLayer(activation=activation, **layer_cfg)
            for _ in range(self.decoder.num_layers)
        ])
        dims = self.embed_dims
        if self.query_pos_method == 'as_reg':
            self.query_pos_head = _dfine_layers.MLP(4, dims, dims, 3,
                                                    self.mlp_act)
        else:
            self.query_pos_head = _dfine_layers.MLP(4, 2 * dims, dims, 2,
                                                    self.mlp_act)
        for branch in self.bbox_head.reg_branches:
            for index, module in enumerate(branch):
                if isinstance(module, nn.ReLU):
                    branch[index] = _rtdetr_layers.build_activation(
                        self.mlp_act)

    def init_weights(self) -> None:
        """``RTDETR.init_weights`` (xavier on every query position layer),
        then PyTorch's default init for the layers upstream leaves alone
        (the third of the 'as_reg' head)."""
        super().init_weights()
        for layer in self.query_pos_head.layers[2:]:
            layer.reset_parameters()


__all__ = ['DEIMRTDETR', 'DEIMRTDETRDecoderLayer']
