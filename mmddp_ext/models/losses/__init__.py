from .guarded_score_loss import clean_score_targets, guarded_score_loss
from .safe_varifocal_loss import SafeVarifocalLoss

__all__ = ['SafeVarifocalLoss', 'clean_score_targets', 'guarded_score_loss']
