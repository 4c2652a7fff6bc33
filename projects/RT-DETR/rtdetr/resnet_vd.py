"""ResNet-vd with upstream RT-DETR's first-block shortcut."""
from mmcv.cnn import build_conv_layer, build_norm_layer
from mmdet.models.backbones import ResNetV1d
from mmdet.registry import MODELS
from torch import nn


@MODELS.register_module()
class ResNetVdRTDETR(ResNetV1d):
    """``ResNetV1d`` (deep 32-32-64 stem, average-pool shortcuts) whose
    first block always has a projection shortcut, as upstream's
    ``PResNet`` variant 'd'.

    Differs from ``ResNet.make_res_layer`` for ResNet-18/34 only: there the
    first block of stage 1 maps 64 to 64 channels with stride 1, which
    mmdet gives an identity shortcut, while ``PResNet`` gives every
    stage's first block a 1x1 conv + BN shortcut (``short``). This class
    adds that shortcut, in mmdet's ``downsample`` layout (pool, conv, BN;
    the pool is a 1x1 no-op as mmdet uses for ResNet-50's stage 1), so
    upstream r18vd/r34vd checkpoints load. ResNet-50/101 already match.

    Accepts the config keys of ``ResNetV1d``.
    """

    def make_res_layer(self, **kwargs) -> nn.Module:
        """Build a stage; add the projection shortcut where mmdet has
        none."""
        layer = super().make_res_layer(**kwargs)
        first = layer[0]
        if first.downsample is None:
            in_channels = kwargs['inplanes']
            out_channels = kwargs['planes'] * kwargs['block'].expansion
            first.downsample = nn.Sequential(
                nn.AvgPool2d(
                    kernel_size=1,
                    stride=1,
                    ceil_mode=True,
                    count_include_pad=False),
                build_conv_layer(
                    self.conv_cfg,
                    in_channels,
                    out_channels,
                    kernel_size=1,
                    bias=False),
                build_norm_layer(self.norm_cfg, out_channels)[1])
        return layer
