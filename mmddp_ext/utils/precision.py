"""Mixed precision, in one place: the precision a launch trains a config's
``optim_wrapper`` in (:func:`resolve_precision`), and full precision for
the places of a model that need it under autocast (:func:`full_precision`).
"""
from dataclasses import dataclass
from typing import Any, Dict

import torch
from mmengine.optim import AmpOptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import Tensor

# Autocast's reduced precisions.
REDUCED_DTYPES = (torch.float16, torch.bfloat16)

# Keys only AmpOptimWrapper takes.
AMP_ONLY_KEYS = ('loss_scale', 'dtype', 'use_fsdp')
# AmpOptimWrapper dtypes ExtAmpOptimWrapper runs (None: float16).
AMP_DTYPES = (None, 'float16', 'bfloat16', torch.float16, torch.bfloat16)


@dataclass
class Precision:
    """How a launch on a device runs a config's ``optim_wrapper``.

    Args:
        optim_wrapper (dict | Any): The config to build (a copy where it
            changed; the given object where not).
        amp (bool): Mixed precision runs (autocast and a loss scaler).
        dtype (str): ``'float16'``, ``'bfloat16'`` or ``'float32'``.
        device (str): The device it was resolved for.
        reason (str): Why, for the log; empty when the config runs as
            written with no AMP involved.
    """
    optim_wrapper: Any
    amp: bool
    dtype: str
    device: str
    reason: str = ''

    def describe(self) -> str:
        if not self.amp:
            return f'float32 on {self.device}' + (
                f' ({self.reason})' if self.reason else '')
        return (f'mixed precision on {self.device}: {self.dtype} autocast '
                f'with a loss scaler ({self.reason})')


def resolve_precision(optim_wrapper: Any, device: str,
                      cpu_amp: bool = True) -> Precision:
    """The precision a launch on ``device`` trains ``optim_wrapper`` in.

    An ``AmpOptimWrapper`` config (that exact type: a subclass is the
    user's own and runs as written) builds
    :class:`~mmddp_ext.optim.ExtAmpOptimWrapper` on CPU and CUDA ranks,
    so both run mixed precision through the same code; on CPU ranks with
    ``cpu_amp=False`` (``mmddp_ext_cfg.cpu_amp``) it builds a float32
    ``OptimWrapper`` instead (its AMP-only keys dropped). Other wrappers,
    devices and dtypes run as written.

    Args:
        optim_wrapper (dict | Any): The config's ``optim_wrapper``.
        device (str): ``'cpu'``, ``'cuda'`` or another MMEngine device.
        cpu_amp (bool): Run AMP on CPU ranks. Defaults to True.

    Raises:
        TypeError: ``cpu_amp`` is not a bool.
    """
    if not isinstance(cpu_amp, bool):
        raise TypeError(
            'mmddp_ext_cfg.cpu_amp must be True (AmpOptimWrapper configs '
            'train in mixed precision on CPU ranks too) or False (float32 '
            f'on CPU ranks), but got {cpu_amp!r} ({type(cpu_amp).__name__}).')
    kind = (optim_wrapper.get('type', 'OptimWrapper') if isinstance(
        optim_wrapper, dict) else None)
    cls = OPTIM_WRAPPERS.get(kind) if isinstance(kind, str) else kind
    if not (isinstance(cls, type) and issubclass(cls, AmpOptimWrapper)):
        return Precision(optim_wrapper, False, 'float32', device)
    dtype = optim_wrapper.get('dtype', None)
    name = 'float16' if dtype is None else str(dtype).replace('torch.', '')
    runs_ext = (cls is AmpOptimWrapper and dtype in AMP_DTYPES
                and device in ('cpu', 'cuda'))
    if runs_ext and (device != 'cpu' or cpu_amp):
        built = type(optim_wrapper)(optim_wrapper)
        built['type'] = 'ExtAmpOptimWrapper'
        return Precision(built, True, name, device,
                         'AmpOptimWrapper built as ExtAmpOptimWrapper')
    if device != 'cpu':
        return Precision(optim_wrapper, True, name, device,
                         f'{getattr(cls, "__name__", cls)} as configured')
    plain: Dict[str, Any] = {
        k: v
        for k, v in optim_wrapper.items() if k not in AMP_ONLY_KEYS
    }
    plain['type'] = 'OptimWrapper'
    why = ('mmddp_ext_cfg.cpu_amp=False' if runs_ext else
           f'{getattr(cls, "__name__", cls)} with dtype {dtype!r} runs on '
           'GPUs only; ExtAmpOptimWrapper runs AmpOptimWrapper configs '
           'with dtype float16 or bfloat16 on CPU ranks')
    return Precision(type(optim_wrapper)(plain), False, 'float32', device,
                     f'{why}: AmpOptimWrapper ran as OptimWrapper')


def full_precision(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 when it is in one of autocast's reduced
    precisions (float16, bfloat16), else unchanged: float32 stays float32
    and float64 stays float64 (the ports' equivalence runs with upstream
    are in float64, which a plain ``.float()`` would round).

    For the places that need full precision under an AMP recipe (matching
    costs, distribution losses, NMS inputs); each caller says why.
    """
    if tensor.dtype in REDUCED_DTYPES:
        return tensor.float()
    return tensor
