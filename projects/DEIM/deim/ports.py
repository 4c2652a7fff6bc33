"""What DEIM takes from the projects it builds on: D-FINE
(``projects/D-FINE``, package ``dfine``) and RT-DETR
(``projects/RT-DETR``, package ``rtdetr``).

DEIM trains D-FINE and RT-DETRv2 models with a new matching loss and
recipe. This is the one module of DEIM that imports another project; the
README's ``Requires`` line names those projects, and every name below is
one their packages export (their ``__all__``), never one of their
modules (``tests/test_house/test_project_seams.py`` checks all three).

The packages are imported under the names the configs' ``custom_imports``
give them, so that their components register once. Those names have the
project directories' hyphens, which an ``import`` statement cannot
spell, hence ``import_module``.
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
