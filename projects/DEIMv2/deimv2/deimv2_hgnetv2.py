"""HGNetv2 with DEIMv2's three-stage sizes (Atto, Femto, Pico)."""
from mmdet.registry import MODELS

from .ports import HGNetv2

# Upstream's arch_configs 'stage3' of the three-stage sizes: (in_channels,
# mid_channels, out_channels, num_blocks, downsample, light_block,
# kernel_size, num_layers). Their stem and first two stages are B0's.
LIGHT_STAGE3 = {
    'Atto': (256, 64, 256, 1, True, True, 3, 3),
    'Femto': (256, 64, 512, 1, True, True, 5, 3),
    'Pico': (256, 64, 512, 2, True, True, 5, 3),
}
LIGHT_STAGES = 3


@MODELS.register_module()
class DEIMv2HGNetv2(HGNetv2):
    """:class:`HGNetv2` that also builds DEIMv2's Atto, Femto and Pico:
    B0's stem and first two stages, a lighter third stage (upstream
    ``arch_configs``), and no fourth stage. Stage 2 (stride 16) is the
    one the light encoder takes.

    Upstream starts these sizes from B0's ImageNet file
    (``PPHGNetV2_B0_stage1.pth``), loading what matches: stem, the first
    two stages and the third stage's tensors of B0's shapes (all of them
    for Pico, whose stage is B0's). ``init_cfg=dict(type='Pretrained',
    checkpoint=...)`` does the same (MMEngine loads it with
    ``strict=False``: keys of another shape or absent here are skipped and
    listed in a warning), as the COCO configs set it.

    Args:
        arch (str): 'Atto', 'Femto', 'Pico', or a size of
            :class:`HGNetv2` ('B0' to 'B6'). Defaults to 'Atto'.
        out_indices (Sequence[int]): Stages returned, 0-based; the light
            sizes have stages 0-2. Defaults to (2, ).
        **kwargs: Other keys of :class:`HGNetv2` (``use_lab``,
            ``frozen_stages``, ``freeze_norm``, ``channels_last``,
            ``init_cfg``).
    """

    def __init__(self,
                 arch: str = 'Atto',
                 out_indices=(2, ),
                 **kwargs) -> None:
        light = arch in LIGHT_STAGE3
        if light and not all(0 <= i < LIGHT_STAGES for i in out_indices):
            raise ValueError(
                f'DEIMv2HGNetv2 arch {arch!r} has stages 0..2, but '
                f'out_indices is {list(out_indices)}. DEIMv2 '
                'Atto/Femto/Pico use (2, ).')
        frozen = kwargs.get('frozen_stages', -1)
        if light and frozen > LIGHT_STAGES:
            raise ValueError(
                f'DEIMv2HGNetv2 frozen_stages must be in -1..3 for arch '
                f'{arch!r} (three stages), but got {frozen}.')
        super().__init__(
            arch='B0' if light else arch, out_indices=out_indices, **kwargs)
        if light:
            stage_type = type(self.stages[2])
            (in_channels, mid_channels, out_channels, num_blocks, downsample,
             light_block, kernel_size, num_layers) = LIGHT_STAGE3[arch]
            self.stages[2] = stage_type(
                in_channels,
                mid_channels,
                out_channels,
                num_blocks,
                num_layers,
                downsample=downsample,
                light_block=light_block,
                kernel_size=kernel_size,
                use_lab=kwargs.get('use_lab', False))
            del self.stages[3]
            self.out_channels = self.out_channels[:2] + [out_channels]
            # the replaced stage is built unfrozen: freeze again
            self._freeze()
