from .ext_amp_optim_wrapper import ExtAmpOptimWrapper
from .regex_optim_wrapper_constructor import RegexOptimWrapperConstructor

__all__ = ['ExtAmpOptimWrapper', 'RegexOptimWrapperConstructor']
