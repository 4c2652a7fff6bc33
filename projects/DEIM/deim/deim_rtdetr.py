"""RT-DETRv2 with DEIM's model changes, on the RT-DETR port."""
from mmdet.registry import MODELS
from torch import nn

from .ports import MLP, RTDETR, build_activation

QUERY_POS_METHODS = ('default', 'as_reg')


@MODELS.register_module()
class DEIMRTDETR(RTDETR):
    """RT-DETRv2 as DEIM builds it (``engine/deim/rtdetrv2_decoder.py``):
    ``RTDETR`` with three of DEIM's keys.

    - ``decoder.layer_cfg.activation``: the decoder FFNs' (a key of
      RT-DETR's ``RTDETRDecoderLayer``, which builds them; RT-DETR's
      default 'relu', DEIM's configs 'silu').
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
        **kwargs: Keys of ``RTDETR``.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

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
        """``RTDETR._init_layers``, then DEIM's query position head and
        box MLP activation."""
        super()._init_layers()
        dims = self.embed_dims
        if self.query_pos_method == 'as_reg':
            self.query_pos_head = MLP(4, dims, dims, 3, self.mlp_act)
        else:
            self.query_pos_head = MLP(4, 2 * dims, dims, 2, self.mlp_act)
        for branch in self.bbox_head.reg_branches:
            for index, module in enumerate(branch):
                if isinstance(module, nn.ReLU):
                    branch[index] = build_activation(self.mlp_act)

    def init_weights(self) -> None:
        """``RTDETR.init_weights`` (xavier on every query position layer),
        then PyTorch's default init for the layers upstream leaves alone
        (the third of the 'as_reg' head)."""
        super().init_weights()
        for layer in self.query_pos_head.layers[2:]:
            layer.reset_parameters()


__all__ = ['DEIMRTDETR']
