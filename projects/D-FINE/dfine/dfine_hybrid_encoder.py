"""D-FINE's hybrid encoder as an MMDetection neck."""
from collections import OrderedDict

from mmdet.registry import MODELS
from torch import nn

from .dfine_encoder_layers import RepNCSPELAN4, SCDown
from .ports import ConvNormLayer, HybridEncoder


@MODELS.register_module()
class DFINEHybridEncoder(HybridEncoder):
    """Hybrid encoder of D-FINE: RT-DETR's (:class:`HybridEncoder`: 1x1
    projections, AIFI on the coarsest level, top-down FPN and bottom-up
    PAN) with lighter fusion layers.

    Overrides only ``HybridEncoder``'s builders of the per-level modules
    (``__init__`` and ``forward`` are RT-DETR's):

    - ``_build_input_proj``: the 1x1 conv and BN are named ``conv`` /
      ``norm`` as upstream (RT-DETR's are ``0`` / ``1``);
    - ``_build_lateral_conv``: 1x1 conv + BN without activation;
    - ``_build_fusion_block`` (``fpn_blocks`` / ``pan_blocks``):
      :class:`RepNCSPELAN4` (hidden width ``2 * hidden_dim``, branch width
      ``round(expansion * hidden_dim // 2)``, ``round(3 * depth_mult)``
      RepVGG blocks);
    - ``_build_downsample_conv``: :class:`SCDown` (1x1 conv, then a
      depth-wise stride-2 3x3 conv, no activation).

    Module names are upstream's (prefix ``encoder.`` there, ``neck.``
    here), so converted checkpoints load key for key.

    Args:
        **kwargs: Keys of :class:`HybridEncoder`, with D-FINE's values:
            ``expansion`` is the branch width ratio of the fusion blocks
            (0.34 for N, 0.5 for S, 1.0 otherwise) and ``depth_mult``
            multiplies their 3 RepVGG blocks (0.5 for N, 0.34 for S, 0.67
            for M); ``act`` is the activation of the fusion blocks only.
    """

    def _build_input_proj(self, in_channels: int) -> nn.Module:
        """Differs from ``HybridEncoder._build_input_proj`` by the names of
        the conv and BN (upstream D-FINE's ``conv`` / ``norm``)."""
        return nn.Sequential(
            OrderedDict(
                conv=nn.Conv2d(in_channels, self.hidden_dim, 1, bias=False),
                norm=nn.BatchNorm2d(self.hidden_dim)))

    def _build_lateral_conv(self) -> nn.Module:
        """Differs from ``HybridEncoder._build_lateral_conv``: no
        activation (upstream D-FINE)."""
        return ConvNormLayer(self.hidden_dim, self.hidden_dim, 1)

    def _build_fusion_block(self) -> nn.Module:
        """Replaces RT-DETR's CSP block by D-FINE's lighter GELAN block."""
        return RepNCSPELAN4(
            self.hidden_dim * 2,
            self.hidden_dim,
            self.hidden_dim * 2,
            round(self.expansion * self.hidden_dim // 2),
            round(3 * self.depth_mult),
            act=self.act)

    def _build_downsample_conv(self) -> nn.Module:
        """Replaces RT-DETR's stride-2 conv by :class:`SCDown` (in an
        ``nn.Sequential``, upstream's key ``downsample_convs.i.0``)."""
        return nn.Sequential(SCDown(self.hidden_dim, self.hidden_dim, 3, 2))
