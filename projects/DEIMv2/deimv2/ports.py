"""The parts of the D-FINE, DEIM and RT-DETR ports (projects/D-FINE,
projects/DEIM, projects/RT-DETR) that DEIMv2 reuses.

DEIMv2 is DEIM's D-FINE model with new backbones, encoders and decoder
layers; everything else (query selection, denoising, FDR decoder, the
criterion, the recipe machinery) is theirs. Names come from each
package's face (its ``__all__``), imported under the names the configs'
``custom_imports`` give them so that their components register once; the
project directories have hyphens, so with ``import_module``, here and
nowhere else in DEIMv2.
"""
from importlib import import_module

_rtdetr = import_module('projects.RT-DETR.rtdetr')
ConvNormLayer = _rtdetr.ConvNormLayer
RepVggBlock = _rtdetr.RepVggBlock
build_activation = _rtdetr.build_activation

_dfine = import_module('projects.D-FINE.dfine')
DFINE = _dfine.DFINE
DFINEHybridEncoder = _dfine.DFINEHybridEncoder
HGNetv2 = _dfine.HGNetv2
MLP = _dfine.MLP
DFINEDecoder = _dfine.DFINEDecoder
PerLevelDeformableAttention = _dfine.PerLevelDeformableAttention
FP16_MAX = _dfine.FP16_MAX

_deim = import_module('projects.DEIM.deim')
CollateBatchAugment = _deim.CollateBatchAugment
DEIMHead = _deim.DEIMHead

__all__ = [
    'ConvNormLayer', 'RepVggBlock', 'build_activation', 'DFINE',
    'DFINEHybridEncoder', 'HGNetv2', 'MLP', 'DFINEDecoder',
    'PerLevelDeformableAttention', 'FP16_MAX', 'CollateBatchAugment',
    'DEIMHead'
]
