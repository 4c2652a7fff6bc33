"""``AmpOptimWrapper`` that runs on the device the model trains on."""
import math
from contextlib import contextmanager
from typing import Optional, Union

import torch
import torch.nn as nn
from mmengine.device import get_device
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

# Message hub scalars (shown in every training log line).
LOSS_SCALE_SCALAR = 'train/loss_scale'
SCALER_SKIPS_SCALAR = 'train/amp_skipped_steps'
# Devices ``torch.autocast`` and ``torch.amp.GradScaler`` take by name.
AMP_DEVICES = ('cpu', 'cuda')


@OPTIM_WRAPPERS.register_module()
class ExtAmpOptimWrapper(AmpOptimWrapper):
    """Mixed precision training on CPU or CUDA ranks, with the loss scale
    and the scaler's skipped steps in the log.

    ``ExtRunner`` builds it for every ``AmpOptimWrapper`` config (see
    :func:`~mmddp_ext.utils.precision.resolve_precision`), so CPU ranks
    run a GPU recipe's mixed precision as mixed precision, through the same
    code as GPU ranks. It differs from ``AmpOptimWrapper``:

    - ``__init__`` replaces ``AmpOptimWrapper.__init__``, which asserts
      that a GPU, NPU, MLU or MUSA device exists and builds
      ``torch.cuda.amp.GradScaler``: the scaler here is
      ``torch.amp.GradScaler(device)`` (the same dynamic scaling,
      ``torch.cuda.amp.GradScaler`` is its CUDA alias). ``loss_scale``,
      ``dtype`` and ``use_fsdp`` take the same values.
    - ``optim_context`` enters ``torch.autocast(device, dtype)``: MMEngine's
      ``autocast`` accepts only bfloat16 on the CPU; upstream RT-DETR,
      D-FINE and DEIM recipes autocast in float16, which torch runs on the
      CPU too.
    - ``step`` records ``train/loss_scale`` and, with a dynamic scale, the
      count of steps the scaler skipped for non-finite gradients
      (``train/amp_skipped_steps``: while the scale settles at the start,
      and after an overflow).
    - ``_clip_grad`` leaves a non-finite gradient norm out of the log: the
      scaler skips that step and lowers the scale, and MMEngine's window
      mean would show ``grad_norm: nan`` for the whole log window.

    Args:
        loss_scale (float | str | dict): ``'dynamic'`` (default): a dynamic
            scale from torch's defaults (65536, halved on every step with
            non-finite gradients, doubled after 2000 finite ones); a float:
            a static scale; a dict: ``torch.amp.GradScaler`` arguments.
            Defaults to 'dynamic'.
        dtype (str | torch.dtype, optional): The autocast dtype:
            ``'float16'`` or ``'bfloat16'``. None: float16, the dtype of
            torch's CUDA autocast and of the upstream recipes. Defaults to
            None.
        use_fsdp (bool): Use ``ShardedGradScaler`` (for
            ``FullyShardedDataParallel``). Defaults to False.
        device (str, optional): ``'cpu'`` or ``'cuda'``; None: the device
            MMEngine trains on (``mmengine.device.get_device()``).
            Defaults to None.
        **kwargs: ``OptimWrapper`` arguments (``optimizer``,
            ``accumulative_counts``, ``clip_grad``).
    """

    def __init__(self,
                 loss_scale: Union[str, float, dict] = 'dynamic',
                 dtype: Union[str, torch.dtype, None] = None,
                 use_fsdp: bool = False,
                 device: Optional[str] = None,
                 **kwargs) -> None:
        device = get_device() if device is None else device
        if device not in AMP_DEVICES:
            raise ValueError(
                f'ExtAmpOptimWrapper: device must be one of {AMP_DEVICES} '
                f'(or None for the training device), but got {device!r}. '
                "On other accelerators use MMEngine's AmpOptimWrapper.")
        OptimWrapper.__init__(self, **kwargs)
        self.device = device
        self.cast_dtype = _checked_dtype(dtype)
        self._scale_update_param = None
        if use_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import \
                ShardedGradScaler

            def scaler_type(**args):
                return ShardedGradScaler(device=device, **args)
        else:

            def scaler_type(**args):
                return torch.amp.GradScaler(device, **args)

        if loss_scale == 'dynamic':
            self.loss_scaler = scaler_type()
        elif isinstance(loss_scale, float):
            self._scale_update_param = loss_scale
            self.loss_scaler = scaler_type(init_scale=loss_scale)
        elif isinstance(loss_scale, dict):
            self.loss_scaler = scaler_type(**loss_scale)
        else:
            raise TypeError(
                'ExtAmpOptimWrapper: loss_scale must be "dynamic", a float '
                '(a static scale) or a dict of torch.amp.GradScaler '
                f'arguments, but got {loss_scale!r} '
                f'({type(loss_scale).__name__}).')
        self.scaler_skipped_steps = 0
        self._last_scale: Optional[float] = None

    @property
    def dynamic_scale(self) -> bool:
        """The scale backs off on non-finite gradients (not static)."""
        return (self._scale_update_param is None
                and self.loss_scaler.is_enabled())

    def step(self, **kwargs) -> None:
        """``AmpOptimWrapper.step``, then the scale and skip count go to the
        message hub. A dynamic scale drops exactly when the scaler skipped
        the step (found non-finite gradients), so comparing it with the
        scale of the step before tells a skip without reading the scaler's
        private state (one host synchronisation per step, as MMEngine's
        gradient norm log)."""
        before = self._last_scale
        if before is None:
            before = self.loss_scaler.get_scale()
        super().step(**kwargs)
        after = self._last_scale = self.loss_scaler.get_scale()
        if self.dynamic_scale and after < before:
            self.scaler_skipped_steps += 1
        self.message_hub.update_scalar(LOSS_SCALE_SCALAR, after)
        self.message_hub.update_scalar(SCALER_SKIPS_SCALAR,
                                       self.scaler_skipped_steps)

    def load_state_dict(self, state_dict: dict) -> None:
        """``AmpOptimWrapper.load_state_dict``; the next step compares with
        the loaded scale."""
        super().load_state_dict(state_dict)
        self._last_scale = None

    def back_off(self) -> None:
        """Lower the scale as the scaler does on a step it skips, for a step
        skipped before the scaler saw it (see :func:`back_off_loss_scale`).
        """
        scale = back_off_loss_scale(self)
        if scale is not None:
            self._last_scale = scale
            self.message_hub.update_scalar(LOSS_SCALE_SCALAR, scale)

    def _clip_grad(self) -> None:
        """Differs from ``OptimWrapper._clip_grad`` in the log only: a
        non-finite norm (the scaler's overflow signal; it skips this step)
        is not recorded as ``train/grad_norm``."""
        params = [
            param for group in self.optimizer.param_groups
            for param in group['params']
            if param.requires_grad and param.grad is not None
        ]
        if not params:
            return
        norm = self.clip_func(params, **self.clip_grad_kwargs)
        if norm is not None and math.isfinite(float(norm)):
            self.message_hub.update_scalar('train/grad_norm', float(norm))

    @contextmanager
    def optim_context(self, model: nn.Module):
        """``OptimWrapper.optim_context`` (gradient accumulation) inside
        ``torch.autocast(self.device, self.cast_dtype)``."""
        with OptimWrapper.optim_context(self, model), torch.autocast(
                device_type=self.device, dtype=self.cast_dtype):
            yield


def back_off_loss_scale(optim_wrapper) -> Optional[float]:
    """Lower ``optim_wrapper``'s dynamic loss scale as torch's scaler does on
    a step it skips (times its backoff factor, growth count reset), through
    the scaler's public state dict; for a step skipped before the scaler
    saw it (``NonFiniteSkipHook``: a non-finite loss on some rank, whose
    non-finite gradients would have made the scaler skip and back off).

    Returns:
        float | None: The new scale; None when ``optim_wrapper`` has no
        enabled dynamic loss scaler (float32, or a static scale).
    """
    scaler = getattr(optim_wrapper, 'loss_scaler', None)
    static = getattr(optim_wrapper, '_scale_update_param', None) is not None
    if scaler is None or not scaler.is_enabled() or static:
        return None
    state = scaler.state_dict()
    state['scale'] = state['scale'] * state['backoff_factor']
    state['_growth_tracker'] = 0
    scaler.load_state_dict(state)
    return state['scale']


def _checked_dtype(dtype: Union[str, torch.dtype, None]) -> torch.dtype:
    """The autocast dtype for ``dtype`` (None: float16)."""
    accepted = ('float16', 'bfloat16')
    if dtype is None:
        return torch.float16
    if isinstance(dtype, str) and dtype in accepted:
        return getattr(torch, dtype)
    if isinstance(dtype, torch.dtype) and str(dtype)[6:] in accepted:
        return dtype
    raise ValueError(
        f'ExtAmpOptimWrapper: optim_wrapper.dtype must be one of '
        f'{accepted} or None (float16), but got {dtype!r}. For float32 '
        "training use type='OptimWrapper'.")
