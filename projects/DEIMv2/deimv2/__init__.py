"""DEIMv2 (Real-Time Object Detection Meets DINOv3) for MMDetection 3.x,
DDP-safe on batches without GT.

Importing this package registers its components in mmdet's registry (and
the D-FINE, DEIM and RT-DETR ports', which it builds on).
"""
from .deimv2 import DEIMv2
from .deimv2_checkpoint_conversion import (convert_deimv2_hgnetv2_state_dict,
                                           convert_deimv2_state_dict,
                                           convert_deimv2_vit_state_dict,
                                           is_vit_checkpoint)
from .deimv2_collate_batch_augment import DEIMv2CollateBatchAugment
from .deimv2_head import DEIMv2Head
from .deimv2_hgnetv2 import DEIMv2HGNetv2
from .deimv2_hungarian_assigner import DEIMv2HungarianAssigner
from .deimv2_hybrid_encoder import DEIMv2HybridEncoder
from .dinov3_stas import DINOv3STAs
from .lite_encoder import DEIMv2LiteEncoder
from .score_iou_product_cost import ScoreIoUProductCost

__all__ = [
    'DEIMv2', 'DEIMv2CollateBatchAugment', 'DEIMv2Head', 'DEIMv2HGNetv2',
    'DEIMv2HybridEncoder', 'DEIMv2HungarianAssigner', 'DINOv3STAs',
    'DEIMv2LiteEncoder', 'ScoreIoUProductCost',
    'convert_deimv2_hgnetv2_state_dict', 'convert_deimv2_state_dict',
    'convert_deimv2_vit_state_dict', 'is_vit_checkpoint'
]
