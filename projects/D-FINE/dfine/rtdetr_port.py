"""The parts of the RT-DETR port (projects/RT-DETR) that D-FINE reuses.

D-FINE is built on RT-DETR (upstream says so in every file): the same
query selection, denoising groups, varifocal loss and AIFI encoder layer.
Every name comes from the RT-DETR package's face (its ``__all__``), never
from one of its modules. The package is imported under the name the
configs' ``custom_imports`` give it, so that its components register
once; the project directory has a hyphen, so that name is imported with
``import_module``, here and nowhere else in D-FINE.
"""
from importlib import import_module

_rtdetr = import_module('projects.RT-DETR.rtdetr')

RTDETR = _rtdetr.RTDETR
RTDETRHead = _rtdetr.RTDETRHead
RTDETRCdnQueryGenerator = _rtdetr.RTDETRCdnQueryGenerator
HybridEncoder = _rtdetr.HybridEncoder
AIFIEncoder = _rtdetr.AIFIEncoder
ConvNormLayer = _rtdetr.ConvNormLayer
CSPRepLayer = _rtdetr.CSPRepLayer
StaticTensorCache = _rtdetr.StaticTensorCache
build_activation = _rtdetr.build_activation
conv_norm = _rtdetr.conv_norm

__all__ = [
    'RTDETR', 'RTDETRHead', 'RTDETRCdnQueryGenerator', 'HybridEncoder',
    'AIFIEncoder', 'ConvNormLayer', 'CSPRepLayer', 'StaticTensorCache',
    'build_activation', 'conv_norm'
]
