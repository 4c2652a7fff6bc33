"""DEIMv2 (Real-Time Object Detection Meets DINOv3) for MMDetection 3.x,
DDP-safe on batches without GT.

Importing this package registers its components in mmdet's registry (and
the D-FINE, DEIM and RT-DETR ports', which it builds on).
"""
from .deimv2 import DEIMv2
from .deimv2_head import DEIMv2Head
from .deimv2_hgnetv2 import DEIMv2HGNetv2
from .deimv2_hybrid_encoder import DEIMv2HybridEncoder
from .dinov3_stas import DINOv3STAs
from .lite_encoder import DEIMv2LiteEncoder

__all__ = [
    'DEIMv2', 'DEIMv2Head', 'DEIMv2HGNetv2', 'DEIMv2HybridEncoder',
    'DINOv3STAs', 'DEIMv2LiteEncoder'
]
