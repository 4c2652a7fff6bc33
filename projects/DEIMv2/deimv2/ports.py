"""What DEIMv2 takes from the projects it builds on: DEIM
(``projects/DEIM``, package ``deim``), D-FINE (``projects/D-FINE``,
package ``dfine``) and RT-DETR (``projects/RT-DETR``, package
``rtdetr``).

DEIMv2 is DEIM's D-FINE model with new backbones, encoders and decoder
layers; everything else (query selection, denoising, FDR decoder, the
criterion, the recipe machinery) is theirs. This is the one module of
DEIMv2 that imports another project; the README's ``Requires`` line
names those projects, and every name below is one their packages export
(their ``__all__``), never one of their modules
(``tests/test_house/test_project_seams.py`` checks all three).

The packages are imported under the names the configs' ``custom_imports``
give them, so that their components register once: DEIM's with a plain
import, D-FINE's and RT-DETR's with ``import_module``, as their names
have the project directories' hyphens, which an ``import`` statement
cannot spell.
"""
from importlib import import_module

from projects.DEIM.deim import CollateBatchAugment, DEIMHead

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
convert_dfine_state_dict = _dfine.convert_dfine_state_dict
decoder_num_points = _dfine.decoder_num_points

__all__ = [
    'ConvNormLayer', 'RepVggBlock', 'build_activation', 'DFINE',
    'DFINEHybridEncoder', 'HGNetv2', 'MLP', 'DFINEDecoder',
    'PerLevelDeformableAttention', 'FP16_MAX', 'convert_dfine_state_dict',
    'decoder_num_points', 'CollateBatchAugment', 'DEIMHead'
]
