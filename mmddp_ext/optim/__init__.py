from .regex_optim_wrapper_constructor import RegexOptimWrapperConstructor

__all__ = ['RegexOptimWrapperConstructor']
