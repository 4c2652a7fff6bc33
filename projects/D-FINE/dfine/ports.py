"""What D-FINE takes from the project it builds on: RT-DETR
(``projects/RT-DETR``, package ``rtdetr``).

D-FINE is built on RT-DETR (upstream says so in every file): the same
query selection, denoising groups, varifocal loss and AIFI encoder layer.
This is the one module of D-FINE that imports another project; the
README's ``Requires`` line names that project, and every name below is
one its package exports (its ``__all__``), never one of its modules
(``tests/test_house/test_project_seams.py`` checks all three).

The package is imported under the name the configs' ``custom_imports``
give it, so that its components register once. That name has the
project directory's hyphen, which an ``import`` statement cannot spell,
hence ``import_module``.
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
