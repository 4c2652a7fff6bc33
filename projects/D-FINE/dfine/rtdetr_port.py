"""The parts of the RT-DETR port (projects/RT-DETR) that D-FINE reuses.

D-FINE is built on RT-DETR (upstream says so in every file): the same
query selection, denoising groups, varifocal loss and AIFI encoder layer.
The RT-DETR project directory has a hyphen, so it is imported by name.
"""
import importlib

_rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
_layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
_folding = importlib.import_module(
    'projects.RT-DETR.rtdetr.conv_norm_folding')

RTDETR = _rtdetr.RTDETR
RTDETRHead = _rtdetr.RTDETRHead
RTDETRCdnQueryGenerator = _rtdetr.RTDETRCdnQueryGenerator
HybridEncoder = _rtdetr.HybridEncoder
AIFIEncoder = _layers.AIFIEncoder
ConvNormLayer = _layers.ConvNormLayer
CSPRepLayer = _layers.CSPRepLayer
StaticTensorCache = _layers.StaticTensorCache
build_activation = _layers.build_activation
conv_norm = _folding.conv_norm

__all__ = [
    'RTDETR', 'RTDETRHead', 'RTDETRCdnQueryGenerator', 'HybridEncoder',
    'AIFIEncoder', 'ConvNormLayer', 'CSPRepLayer', 'StaticTensorCache',
    'build_activation', 'conv_norm'
]
