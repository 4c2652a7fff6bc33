"""Upstream CO-DETR's decoder layer type, for upstream configs."""
from mmcv.cnn.bricks.transformer import BaseTransformerLayer
from mmdet.registry import MODELS

DECODER_OPERATIONS = {'self_attn', 'norm', 'cross_attn', 'ffn'}


@MODELS.register_module()
class DetrTransformerDecoderLayer(BaseTransformerLayer):
    """mmcv's ``BaseTransformerLayer`` under the type name upstream
    CO-DETR's configs give their decoder layers.

    Upstream registers this name for a ``BaseTransformerLayer`` subclass
    that only checks its ``operation_order``; the port's own configs use
    ``BaseTransformerLayer`` directly. Same parameters, names and forward
    as ``BaseTransformerLayer``, so upstream checkpoints load either way.

    Args:
        attn_cfgs (dict | list[dict]): Self- and cross-attention configs,
            in ``operation_order``.
        feedforward_channels (int): Hidden width of the FFN.
        ffn_dropout (float): FFN dropout. Defaults to 0.0.
        operation_order (tuple[str]): Six operations: 'self_attn',
            'cross_attn', 'ffn' and three 'norm'. Required.
        act_cfg (dict): FFN activation. Defaults to
            dict(type='ReLU', inplace=True). Upstream hands this key to
            ``BaseTransformerLayer``, which ignores it and uses the same
            ReLU; here a different activation takes effect.
        norm_cfg (dict): Norm layer config. Defaults to dict(type='LN').
        ffn_num_fcs (int): Linear layers in the FFN. Defaults to 2.
        **kwargs: Forwarded to ``BaseTransformerLayer``.
    """

    def __init__(self,
                 attn_cfgs,
                 feedforward_channels: int,
                 ffn_dropout: float = 0.0,
                 operation_order: tuple = None,
                 act_cfg: dict = dict(type='ReLU', inplace=True),
                 norm_cfg: dict = dict(type='LN'),
                 ffn_num_fcs: int = 2,
                 **kwargs) -> None:
        if operation_order is None or len(operation_order) != 6 or set(
                operation_order) != DECODER_OPERATIONS:
            raise ValueError(
                'DetrTransformerDecoderLayer: operation_order must hold six '
                "operations, 'self_attn', 'cross_attn', 'ffn' and three "
                f"'norm', but got {operation_order!r}. Use ('self_attn', "
                "'norm', 'cross_attn', 'norm', 'ffn', 'norm').")
        super().__init__(
            attn_cfgs=attn_cfgs,
            ffn_cfgs=dict(
                type='FFN',
                feedforward_channels=feedforward_channels,
                num_fcs=ffn_num_fcs,
                ffn_drop=ffn_dropout,
                act_cfg=act_cfg),
            operation_order=operation_order,
            norm_cfg=norm_cfg,
            **kwargs)
