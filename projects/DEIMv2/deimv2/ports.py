"""The parts of the D-FINE, DEIM and RT-DETR ports (projects/D-FINE,
projects/DEIM, projects/RT-DETR) that DEIMv2 reuses.

DEIMv2 is DEIM's D-FINE model with new backbones, encoders and decoder
layers; everything else (query selection, denoising, FDR decoder, the
criterion, the recipe machinery) is theirs. The project directories have
hyphens, so they are imported by name, as projects/DEIM does; importing
them registers their components.
"""
import importlib

_rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
_rtdetr_layers = importlib.import_module(
    'projects.RT-DETR.rtdetr.rtdetr_layers')
_dfine = importlib.import_module('projects.D-FINE.dfine')
_dfine_decoder = importlib.import_module(
    'projects.D-FINE.dfine.dfine_decoder_layers')
_dfine_encoder = importlib.import_module(
    'projects.D-FINE.dfine.dfine_encoder_layers')
_deim = importlib.import_module('projects.DEIM.deim')

ConvNormLayer = _rtdetr_layers.ConvNormLayer
RepVggBlock = _rtdetr_layers.RepVggBlock
build_activation = _rtdetr_layers.build_activation
DFINE = _dfine.DFINE
DFINEHybridEncoder = _dfine.DFINEHybridEncoder
HGNetv2 = _dfine.HGNetv2
MLP = _dfine_decoder.MLP
DFINEDecoder = _dfine_decoder.DFINEDecoder
PerLevelDeformableAttention = _dfine_decoder.PerLevelDeformableAttention
FP16_MAX = _dfine_decoder.FP16_MAX
SCDown = _dfine_encoder.SCDown
DEIMHead = _deim.DEIMHead

__all__ = [
    'ConvNormLayer', 'RepVggBlock', 'build_activation', 'DFINE',
    'DFINEHybridEncoder', 'HGNetv2', 'MLP', 'DFINEDecoder',
    'PerLevelDeformableAttention', 'FP16_MAX', 'SCDown', 'DEIMHead'
]
