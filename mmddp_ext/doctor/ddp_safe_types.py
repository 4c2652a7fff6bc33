"""Which DDP-safe detector and head classes a DINO-family config should
name: read from the MRO of the classes the config builds.

The doctor's paste line for a rank whose batch has no GT must keep the
detector the user chose: a D-FINE model whose denoising was changed
becomes ``DFINE`` again, not mmdet's DINO. The nearest ancestor that this
package ships (mmddp_ext itself, or a port under the ``projects/`` folder
beside it) and that derives from :class:`DDPSafeDINO` /
:class:`DDPSafeDINOHead` is the class whose behaviour on GT-less batches
is tested here; mmdet's own DINO classes fall back to those two.
"""
import inspect
import os.path as osp
from typing import Optional, Tuple

import torch.nn as nn

PACKAGE = 'mmddp_ext'
DETECTOR = 'DDPSafeDINO'
HEAD = 'DDPSafeDINOHead'


def _shipped(cls: type) -> bool:
    """Whether ``cls`` is this package's: in ``mmddp_ext`` or in a port
    under a ``projects/`` folder that sits beside the ``mmddp_ext``
    package (this repository's layout)."""
    if cls.__module__.split('.')[0] == PACKAGE:
        return True
    try:
        path = inspect.getsourcefile(cls)
    except TypeError:  # a built-in
        return False
    if not path:
        return False
    folder = osp.dirname(osp.abspath(path))
    while True:
        parent = osp.dirname(folder)
        if parent == folder:
            return False
        if osp.basename(folder) == 'projects':
            return osp.isfile(osp.join(parent, PACKAGE, '__init__.py'))
        folder = parent


def nearest_shipped(cls: type, base: type) -> Optional[str]:
    """The registered name of the first class in ``cls``'s MRO that
    derives from ``base`` and that this package ships (None if none)."""
    from mmdet.registry import MODELS
    for klass in cls.__mro__:
        if (isinstance(klass, type) and issubclass(klass, base)
                and _shipped(klass) and MODELS.get(klass.__name__) is klass):
            return klass.__name__
    return None


def ddp_safe_types(model: Optional[nn.Module]) -> Optional[Tuple[str, str]]:
    """``(detector, head)`` type names to paste for a DINO-family
    ``model``; None when it is not one, or already uses exactly those."""
    from mmdet.models.detectors import DINO

    from ..models.dense_heads.ddp_safe_dino_head import DDPSafeDINOHead
    from ..models.detectors.ddp_safe_dino import DDPSafeDINO
    if not isinstance(model, DINO):
        return None
    detector = nearest_shipped(type(model), DDPSafeDINO) or DETECTOR
    head_module = getattr(model, 'bbox_head', None)
    head = (nearest_shipped(type(head_module), DDPSafeDINOHead)
            if head_module is not None else None) or HEAD
    if (detector, head) == (type(model).__name__,
                            type(head_module).__name__):
        return None
    return detector, head
