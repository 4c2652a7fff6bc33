"""The parts of the D-FINE and RT-DETR ports (projects/D-FINE,
projects/RT-DETR) that DEIM reuses.

DEIM trains D-FINE and RT-DETRv2 models with a new matching loss and
recipe. Every name comes from a package's face (its ``__all__``), never
from one of its modules. The packages are imported under the names the
configs' ``custom_imports`` give them, so that their components register
once; the project directories have hyphens, so those names are imported
with ``import_module``, here and nowhere else in DEIM.
"""
from importlib import import_module

_rtdetr = import_module('projects.RT-DETR.rtdetr')
BatchChoiceResize = _rtdetr.BatchChoiceResize
RTDETR = _rtdetr.RTDETR
RTDETRVarifocalLoss = _rtdetr.RTDETRVarifocalLoss
build_activation = _rtdetr.build_activation

_dfine = import_module('projects.D-FINE.dfine')
DFINEHead = _dfine.DFINEHead
MLP = _dfine.MLP

__all__ = [
    'BatchChoiceResize', 'DFINEHead', 'MLP', 'RTDETR', 'RTDETRVarifocalLoss',
    'build_activation'
]
