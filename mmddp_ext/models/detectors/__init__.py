from .ddp_safe_dino import DDPSafeDINO

__all__ = ['DDPSafeDINO']
