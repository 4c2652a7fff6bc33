"""D-FINE for MMDetection 3.x, DDP-safe on batches without GT.

Importing this package registers its components in ``mmdet.registry``
(and the RT-DETR port's, which it builds on).
"""
from .decoupled_distillation_focal_loss import DecoupledDistillationFocalLoss
from .dfine import DFINE
from .dfine_cdn_query_generator import DFINECdnQueryGenerator
from .dfine_checkpoint_conversion import (convert_dfine_state_dict,
                                          convert_dfine_to_upstream,
                                          convert_hgnetv2_state_dict,
                                          decoder_num_points,
                                          dfine_upstream_converter,
                                          is_hgnetv2_checkpoint)
from .dfine_decoder_layers import (FP16_MAX, MLP, DFINEDecoder,
                                   PerLevelDeformableAttention)
from .dfine_head import DFINEHead
from .dfine_hybrid_encoder import DFINEHybridEncoder
from .dfine_upstream_param_names import dfine_upstream_param_names
from .fine_grained_localization_loss import FineGrainedLocalizationLoss
from .hgnetv2 import HGNetv2
from .model_ema import ModelEMA
from .model_ema_hook import ModelEMAHook

__all__ = [
    'DecoupledDistillationFocalLoss', 'DFINE', 'DFINECdnQueryGenerator',
    'DFINEDecoder', 'DFINEHead', 'DFINEHybridEncoder',
    'dfine_upstream_param_names', 'FineGrainedLocalizationLoss', 'FP16_MAX',
    'HGNetv2', 'MLP', 'ModelEMA', 'ModelEMAHook',
    'PerLevelDeformableAttention', 'convert_dfine_state_dict',
    'convert_dfine_to_upstream', 'dfine_upstream_converter',
    'convert_hgnetv2_state_dict', 'decoder_num_points', 'is_hgnetv2_checkpoint'
]
