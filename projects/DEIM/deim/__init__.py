"""DEIM (D-FINE and RT-DETRv2 trained with DEIM's matching and recipe) for
MMDetection 3.x, DDP-safe on batches without GT.

Importing this package registers its components in the mmdet and
MMEngine registries (and the D-FINE and RT-DETR ports', which it builds
on).
"""
from .collate_batch_augment import CollateBatchAugment
from .deim_head import DEIMHead
from .deim_mosaic import DEIMMosaic
from .deim_rtdetr import DEIMRTDETR
from .epoch_policy_dataset import EpochPolicyDataset
from .flat_cosine_lr import FlatCosineLR, FlatCosineParamScheduler
from .matchability_aware_loss import MatchabilityAwareLoss
from .random_iou_crop import RandomIoUCrop
from .set_epoch_hook import SetEpochHook

__all__ = [
    'CollateBatchAugment', 'DEIMHead', 'DEIMMosaic', 'DEIMRTDETR',
    'EpochPolicyDataset', 'FlatCosineLR', 'FlatCosineParamScheduler',
    'MatchabilityAwareLoss', 'RandomIoUCrop', 'SetEpochHook'
]
