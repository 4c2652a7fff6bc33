"""HGNetv2, the backbone of D-FINE and DEIM, as an MMDetection backbone."""
from typing import Sequence, Tuple

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from .hgnetv2_layers import HGStage, StemBlock

# Per size: stem channels (in, mid, out) and, per stage, (in_channels,
# mid_channels, out_channels, num_blocks, downsample, light_block,
# kernel_size, num_layers), upstream's HGNetv2.arch_configs.
ARCH_SETTINGS = {
    'B0': ((3, 16, 16), ((16, 16, 64, 1, False, False, 3,
                          3), (64, 32, 256, 1, True, False, 3,
                               3), (256, 64, 512, 2, True, True, 5, 3),
                         (512, 128, 1024, 1, True, True, 5, 3))),
    'B1': ((3, 24, 32), ((32, 32, 64, 1, False, False, 3,
                          3), (64, 48, 256, 1, True, False, 3,
                               3), (256, 96, 512, 2, True, True, 5, 3),
                         (512, 192, 1024, 1, True, True, 5, 3))),
    'B2': ((3, 24, 32), ((32, 32, 96, 1, False, False, 3,
                          4), (96, 64, 384, 1, True, False, 3,
                               4), (384, 128, 768, 3, True, True, 5, 4),
                         (768, 256, 1536, 1, True, True, 5, 4))),
    'B3': ((3, 24, 32), ((32, 32, 128, 1, False, False, 3,
                          5), (128, 64, 512, 1, True, False, 3,
                               5), (512, 128, 1024, 3, True, True, 5, 5),
                         (1024, 256, 2048, 1, True, True, 5, 5))),
    'B4': ((3, 32, 48), ((48, 48, 128, 1, False, False, 3,
                          6), (128, 96, 512, 1, True, False, 3,
                               6), (512, 192, 1024, 3, True, True, 5, 6),
                         (1024, 384, 2048, 1, True, True, 5, 6))),
    'B5': ((3, 32, 64), ((64, 64, 128, 1, False, False, 3,
                          6), (128, 128, 512, 2, True, False, 3,
                               6), (512, 256, 1024, 5, True, True, 5, 6),
                         (1024, 512, 2048, 2, True, True, 5, 6))),
    'B6': ((3, 48, 96), ((96, 96, 192, 2, False, False, 3,
                          6), (192, 192, 512, 3, True, False, 3,
                               6), (512, 384, 1024, 6, True, True, 5, 6),
                         (1024, 768, 2048, 3, True, True, 5, 6))),
}


@MODELS.register_module()
class HGNetv2(BaseModule):
    """PP-HGNetV2 (upstream D-FINE's ``HGNetv2``): a stride-4 stem and four
    stages of HG blocks (strides 4, 8, 16, 32).

    Parameter names are upstream's (``stem.stem1.conv.weight``,
    ``stages.2.blocks.0.layers.1.conv2.bn.weight``, ...), so upstream's
    ImageNet files (``PPHGNetV2_B0_stage1.pth`` ...) load as they are
    through ``init_cfg=dict(type='Pretrained', checkpoint=...)``, and
    detector checkpoints through ``tools/convert_dfine_checkpoint.py``.

    Freezing is upstream's: ``frozen_stages`` stops gradients only (BN
    layers of frozen parts keep updating their statistics unless
    ``freeze_norm``), and ``freeze_norm`` runs every BN on its running
    statistics with fixed affine parameters, the arithmetic of upstream's
    ``FrozenBatchNorm2d`` (which has no ``num_batches_tracked``; the
    converter fills it).

    Args:
        arch (str): Size, one of 'B0' to 'B6' (D-FINE N/S: 'B0', M: 'B2',
            L: 'B4', X: 'B5'). Defaults to 'B0'.
        use_lab (bool): Learnable affine blocks after every activation
            (upstream ``use_lab``: True for B0 and B2 in the zoo).
            Defaults to False.
        out_indices (Sequence[int]): Stages whose outputs are returned,
            0-based (upstream ``return_idx``). Defaults to (1, 2, 3).
        frozen_stages (int): -1 trains everything; 0 freezes the stem
            (upstream ``freeze_at: 0`` with ``freeze_stem_only: True``);
            ``k > 0`` the stem and stages ``0 .. k - 1`` (upstream
            ``freeze_at: k - 1`` with ``freeze_stem_only: False``).
            Defaults to -1.
        freeze_norm (bool): Upstream ``freeze_norm``: every BN layer in
            eval mode with ``requires_grad=False``. Defaults to False.
        channels_last (bool): In eval mode, run on channels-last (NHWC)
            activations (the returned maps are channels-last too): the
            same values, and on the CPU (oneDNN) about a quarter less time
            for a 640-px forward of B0. Training keeps the default layout:
            PyTorch's CPU batch norm computes the batch statistics of
            channels-last maps less exactly (outputs 1e-5 apart), which
            would move training away from upstream's. Defaults to True.
        init_cfg (dict, optional): MMEngine init config, e.g.
            ``dict(type='Pretrained', checkpoint='PPHGNetV2_B4_stage1.pth')``.
            Defaults to None.
    """

    def __init__(self,
                 arch: str = 'B0',
                 use_lab: bool = False,
                 out_indices: Sequence[int] = (1, 2, 3),
                 frozen_stages: int = -1,
                 freeze_norm: bool = False,
                 channels_last: bool = True,
                 init_cfg=None) -> None:
        super().__init__(init_cfg=init_cfg)
        if arch not in ARCH_SETTINGS:
            raise ValueError(
                f'HGNetv2 arch must be one of {sorted(ARCH_SETTINGS)}, but '
                f"got {arch!r}. D-FINE uses 'B0' (N, S), 'B2' (M), 'B4' (L) "
                "and 'B5' (X).")
        stem_channels, stage_settings = ARCH_SETTINGS[arch]
        bad = [i for i in out_indices if not 0 <= i < len(stage_settings)]
        if bad or not out_indices:
            raise ValueError(
                'HGNetv2 out_indices must be stage indices in 0..3, but got '
                f'{list(out_indices)}. D-FINE-N uses (2, 3), the others '
                '(1, 2, 3).')
        if not -1 <= frozen_stages <= len(stage_settings):
            raise ValueError(
                'HGNetv2 frozen_stages must be in -1..4 (-1 nothing, 0 the '
                f'stem, k the stem and k stages), but got {frozen_stages}.')
        self.out_indices = tuple(out_indices)
        self.frozen_stages = frozen_stages
        self.freeze_norm = freeze_norm
        self.channels_last = channels_last
        self.out_channels = [s[2] for s in stage_settings]
        self.stem = StemBlock(*stem_channels, use_lab=use_lab)
        self.stages = nn.ModuleList(
            HGStage(
                in_channels,
                mid_channels,
                out_channels,
                num_blocks,
                num_layers,
                downsample=downsample,
                light_block=light_block,
                kernel_size=kernel_size,
                use_lab=use_lab)
            for (in_channels, mid_channels, out_channels, num_blocks,
                 downsample, light_block, kernel_size,
                 num_layers) in stage_settings)
        self._freeze()

    def _freeze(self) -> None:
        """Stop gradients of the frozen parts and, with ``freeze_norm``, of
        every BN layer."""
        frozen = ([self.stem] if self.frozen_stages >= 0 else []) + list(
            self.stages[:max(self.frozen_stages, 0)])
        for module in frozen:
            for param in module.parameters():
                param.requires_grad = False
        if self.freeze_norm:
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    for param in module.parameters():
                        param.requires_grad = False

    def train(self, mode: bool = True) -> 'HGNetv2':
        """Set the mode; with ``freeze_norm``, BN layers stay in eval."""
        super().train(mode)
        if mode and self.freeze_norm:
            for module in self.modules():
                if isinstance(module, nn.BatchNorm2d):
                    module.eval()
        return self

    def forward(self, x: Tensor) -> Tuple[Tensor, ...]:
        """Features of the ``out_indices`` stages, fine to coarse."""
        if self.channels_last and not self.training:
            x = x.contiguous(memory_format=torch.channels_last)
        x = self.stem(x)
        outs = []
        for index, stage in enumerate(self.stages):
            x = stage(x)
            if index in self.out_indices:
                outs.append(x)
        return tuple(outs)
