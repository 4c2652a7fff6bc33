from .safe_varifocal_loss import SafeVarifocalLoss

__all__ = ['SafeVarifocalLoss']
