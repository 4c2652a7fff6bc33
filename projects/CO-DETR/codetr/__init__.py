"""CO-DETR (CO-DINO) for MMDetection 3.x, DDP-safe. Importing this package
registers its components in mmdet's MODELS registry."""
from .co_atss_head import CoATSSHead
from .co_dino_head import CoDINOHead
from .co_roi_head import CoStandardRoIHead
from .codetr import CoDETR
from .detr_decoder_layer import DetrTransformerDecoderLayer
from .transformer import (CoDetrTransformerEncoder, CoDinoTransformer,
                          CoDinoTransformerDecoder)

__all__ = [
    'CoDETR', 'CoDINOHead', 'CoATSSHead', 'CoStandardRoIHead',
    'CoDinoTransformer', 'CoDetrTransformerEncoder',
    'CoDinoTransformerDecoder', 'DetrTransformerDecoderLayer'
]
