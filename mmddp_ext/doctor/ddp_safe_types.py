"""Which DDP-safe detector and head classes a DINO-family config should
name: read from mmdet's ``MODELS`` registry and the MRO of the classes the
config builds.

The doctor's paste line for a rank whose batch has no GT must keep the
detector the user chose: a D-FINE model whose denoising was changed
becomes ``DFINE`` again, not mmdet's DINO. The class named is the nearest
one in the MRO that derives from :class:`DDPSafeDINO` /
:class:`DDPSafeDINOHead`, is registered in ``MODELS`` under its own name
(so the pasted ``type`` builds it), and declares in its own class body
that its behaviour on GT-less batches is the DDP-safe one
(``ddp_safe_empty_gt = True``). mmddp_ext's two classes declare it, and so
does each model port that a config's ``custom_imports`` registers; a
subclass that does not (a user's, or a probe that restores upstream's
empty-batch behaviour) falls back to its nearest declared ancestor, and
mmdet's own DINO classes to mmddp_ext's two. Nothing is looked up on disk
and nothing here imports a port: whatever registered a class is the
config's business.
"""
from typing import Optional, Tuple

import torch.nn as nn

DETECTOR = 'DDPSafeDINO'
HEAD = 'DDPSafeDINOHead'
# Set to True in the body of a class whose own GT-less path is DDP-safe.
MARKER = 'ddp_safe_empty_gt'


def declares_ddp_safe(cls: type) -> bool:
    """Whether ``cls`` itself, not an ancestor it inherits the attribute
    from, sets ``ddp_safe_empty_gt = True``: a subclass may change the
    behaviour it inherits, so it has to declare the marker again."""
    return vars(cls).get(MARKER) is True


def nearest_shipped(cls: type, base: type) -> Optional[str]:
    """The registered name of the first class in ``cls``'s MRO that
    derives from ``base``, declares itself DDP-safe
    (:func:`declares_ddp_safe`) and is what mmdet's ``MODELS`` builds
    under its name (None if there is none)."""
    from mmdet.registry import MODELS
    for klass in cls.__mro__:
        if (isinstance(klass, type) and issubclass(klass, base)
                and declares_ddp_safe(klass)
                and MODELS.get(klass.__name__) is klass):
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
