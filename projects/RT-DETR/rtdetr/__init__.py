"""RT-DETR for MMDetection 3.x, DDP-safe on batches without GT.

Importing this package registers its components in ``mmdet.registry``.
"""
from .batch_choice_resize import BatchChoiceResize
from .batched_hungarian_assigner import BatchedHungarianAssigner
from .conv_norm_folding import conv_norm
from .hybrid_encoder import HybridEncoder
from .resnet_vd import ResNetVdRTDETR
from .rtdetr import RTDETR
from .rtdetr_augment_stop_hook import RTDETRAugmentStopHook
from .rtdetr_cdn_query_generator import RTDETRCdnQueryGenerator
from .rtdetr_checkpoint_conversion import (convert_presnet_state_dict,
                                           convert_rtdetr_state_dict,
                                           convert_rtdetr_to_upstream,
                                           is_presnet_checkpoint,
                                           refuse_discrete_sampling,
                                           select_upstream_weights)
from .rtdetr_head import RTDETRHead
from .rtdetr_layers import (AIFIEncoder, ConvNormLayer, CSPRepLayer,
                            RepVggBlock, RTDETRDecoderLayer, StaticTensorCache,
                            build_activation)
from .rtdetr_upstream_param_names import rtdetr_upstream_param_names
from .rtdetr_varifocal_loss import RTDETRVarifocalLoss

# The registered components, then the layers and helpers that the ports
# built on RT-DETR (D-FINE, DEIM) take from this package, then the
# checkpoint conversion (select_upstream_weights reads the family's files).
__all__ = [
    'BatchChoiceResize', 'BatchedHungarianAssigner', 'HybridEncoder',
    'ResNetVdRTDETR', 'RTDETR', 'RTDETRAugmentStopHook',
    'RTDETRCdnQueryGenerator', 'RTDETRHead', 'RTDETRVarifocalLoss',
    'rtdetr_upstream_param_names', 'AIFIEncoder', 'ConvNormLayer',
    'CSPRepLayer', 'RepVggBlock', 'RTDETRDecoderLayer', 'StaticTensorCache',
    'build_activation', 'conv_norm', 'convert_presnet_state_dict',
    'convert_rtdetr_state_dict', 'convert_rtdetr_to_upstream',
    'is_presnet_checkpoint', 'refuse_discrete_sampling',
    'select_upstream_weights'
]
