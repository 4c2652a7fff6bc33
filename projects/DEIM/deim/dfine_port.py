"""The parts of the D-FINE and RT-DETR ports (projects/D-FINE,
projects/RT-DETR) that DEIM reuses.

DEIM trains D-FINE and RT-DETRv2 models with a new matching loss and
recipe. The project directories have hyphens, so they are imported by
name; importing them registers their components.
"""
import importlib

_dfine = importlib.import_module('projects.D-FINE.dfine')
_rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')

BatchChoiceResize = _rtdetr.BatchChoiceResize
RTDETRVarifocalLoss = _rtdetr.RTDETRVarifocalLoss
DFINEHead = _dfine.DFINEHead

__all__ = ['BatchChoiceResize', 'DFINEHead', 'RTDETRVarifocalLoss']
