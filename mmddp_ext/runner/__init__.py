from .ext_runner import ExtRunner

__all__ = ['ExtRunner']
