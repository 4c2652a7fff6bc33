from .ddp_safe_dino_head import DDPSafeDINOHead

__all__ = ['DDPSafeDINOHead']
