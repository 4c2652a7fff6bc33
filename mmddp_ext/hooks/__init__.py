from .safe_checkpoint_hook import SafeCheckpointHook

__all__ = ['SafeCheckpointHook']
