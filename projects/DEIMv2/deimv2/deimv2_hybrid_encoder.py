"""DEIMv2's hybrid encoder (HGNetv2 N to X, DINOv3 S to X) as an
MMDetection neck."""
from typing import List, Tuple

import torch.nn.functional as F
from mmdet.registry import MODELS
from torch import Tensor, nn

from .deimv2_encoder_layers import GELANBlock
from .ports import DFINEHybridEncoder

FUSION_VERSIONS = ('dfine', 'deim')


@MODELS.register_module()
class DEIMv2HybridEncoder(DFINEHybridEncoder):
    """D-FINE's hybrid encoder (:class:`DFINEHybridEncoder`: 1x1
    projections, AIFI, top-down FPN, bottom-up PAN with ``SCDown``) as
    DEIMv2 configures it (``csp_type: csp2``, ``fuse_op: sum``):

    - the two maps meeting in an FPN / PAN block are added, not
      concatenated, so the blocks take ``hidden_dim`` channels;
    - the blocks are :class:`GELANBlock` with upstream's ``CSPLayer2``
      stages, followed by a 3x3 conv (``version='dfine'``, DEIMv2 N and S)
      or not (``version='deim'``: M, L, X and the DINOv3 sizes);
    - a level that already has ``hidden_dim`` channels is not projected
      (the DINOv3 sizes), as upstream.

    Module names are upstream's (prefix ``encoder.`` there, ``neck.``
    here).

    Args:
        version (str): 'dfine' or 'deim' (see above). Defaults to 'deim'.
        *args: Positional arguments of :class:`DFINEHybridEncoder`.
        **kwargs: Keys of :class:`DFINEHybridEncoder` (``in_channels``,
            ``hidden_dim``, ``num_heads``, ``feedforward_channels``,
            ``dropout``, ``enc_act``, ``use_encoder_idx``,
            ``num_encoder_layers``, ``pe_temperature``, ``expansion``,
            ``depth_mult``, ``act``, ``init_cfg``).
    """

    def __init__(self, *args, version: str = 'deim', **kwargs) -> None:
        if version not in FUSION_VERSIONS:
            raise ValueError(
                f'DEIMv2HybridEncoder version must be one of '
                f'{FUSION_VERSIONS}, but got {version!r}: upstream\'s '
                "'dfine' (N, S) or 'deim' (M, L, X, DINOv3 sizes).")
        # read by the builders, which the base __init__ calls
        self.version = version
        super().__init__(*args, **kwargs)

    def _build_input_proj(self, in_channels: int) -> nn.Module:
        """``DFINEHybridEncoder._build_input_proj``, or none where the
        level already has ``hidden_dim`` channels (upstream)."""
        if in_channels == self.hidden_dim:
            return nn.Identity()
        return super()._build_input_proj(in_channels)

    def _build_fusion_block(self) -> nn.Module:
        """Replaces D-FINE's GELAN block: :class:`GELANBlock` on
        ``hidden_dim`` channels (the two maps are summed) with
        ``CSPLayer2`` stages, with or without the 3x3 convs
        (``version``)."""
        return GELANBlock(
            self.hidden_dim,
            self.hidden_dim,
            self.hidden_dim * 2,
            round(self.expansion * self.hidden_dim // 2),
            round(3 * self.depth_mult),
            with_conv=self.version == 'dfine',
            act=self.act)

    def _fuse(self, proj: List[Tensor]) -> Tuple[Tensor]:
        """Replaces ``HybridEncoder._fuse``: the same FPN and PAN with the
        two maps added instead of concatenated (upstream ``fuse_op:
        sum``). A ``_merge`` seam in ``HybridEncoder._fuse`` would make
        this a one-line override."""
        num_levels = len(proj)
        inner = [proj[-1]]
        for step, level in enumerate(range(num_levels - 1, 0, -1)):
            high = self.lateral_convs[step](inner[0])
            inner[0] = high
            low = proj[level - 1]
            up = F.interpolate(high, size=low.shape[-2:], mode='nearest')
            inner.insert(0, self.fpn_blocks[step](up + low))
        outs = [inner[0]]
        for step in range(num_levels - 1):
            down = self.downsample_convs[step](outs[-1])
            outs.append(self.pan_blocks[step](down + inner[step + 1]))
        return tuple(outs)
