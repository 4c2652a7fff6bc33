from .auto_ddp import AutoDDP, UnexpectedUnusedParameterError

__all__ = ['AutoDDP', 'UnexpectedUnusedParameterError']
