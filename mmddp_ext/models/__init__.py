"""DDP-safe building blocks shared by the DETR-family ports.

Importing this package registers them in ``mmdet.registry.MODELS``.
"""
from .dense_heads import DDPSafeDINOHead
from .detectors import DDPSafeDINO
from .layers import DUMMY_DN_GROUP_KEY, DDPSafeCdnQueryGenerator
from .losses import SafeVarifocalLoss

__all__ = [
    'DDPSafeCdnQueryGenerator', 'DUMMY_DN_GROUP_KEY', 'DDPSafeDINOHead',
    'DDPSafeDINO', 'SafeVarifocalLoss'
]
