"""CPU twins of what a GPU launch has and CPU ranks cannot run.

The probe runs a config as it would run on N GPUs, on CPU ranks. Where a
GPU launch uses something that does not run on CPU, the probe uses its
twin and the report says so:

- SyncBatchNorm (``sync_bn``, ``norm_cfg=dict(type='SyncBN')``, a model
  that converts itself, mmcv's ``SyncBatchNorm``): torch's and mmcv's
  raise on CPU tensors. The twin computes the same statistics, the
  per-channel sum and sum of squares over every rank's batch, with one
  autograd-aware all-reduce over the gloo group (one in the forward, one
  in the backward); the GPU layers gather per-rank statistics instead, so
  the collectives the report lists for these layers are the twin's.
- AMP (``AmpOptimWrapper``): runs as AMP, in the config's autocast dtype
  on the CPU (``ExtAmpOptimWrapper``, as ``ExtRunner`` runs it on CPU
  ranks), so a half-precision fault of the model shows in the probe. Its
  dynamic loss scale starts at 1 instead of 65536: the scale changes
  gradient magnitudes, not which parameters get gradients or which
  collectives run, and so the gradients the probe records and compares
  are the model's own; the scaler still skips a step whose gradients are
  non-finite, as on GPUs.
- The device: every tensor is on the CPU.
"""
import contextlib
from typing import Iterator, List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.nn.functional import all_reduce as autograd_all_reduce


def _sync_batch_norm_classes() -> List[type]:
    classes = [nn.SyncBatchNorm]
    try:
        from mmcv.ops import SyncBatchNorm as MMCVSyncBatchNorm
        classes.append(MMCVSyncBatchNorm)
    except ImportError:  # mmcv without ops
        pass
    return classes


def _group(module: nn.Module):
    return (getattr(module, 'process_group', None)
            or getattr(module, 'group', None) or dist.group.WORLD)


def _update_running_stats(module: nn.Module, mean: torch.Tensor,
                          var: torch.Tensor, count: torch.Tensor) -> None:
    if getattr(module, 'num_batches_tracked', None) is not None:
        module.num_batches_tracked.add_(1)
    momentum = module.momentum
    if momentum is None:  # cumulative moving average, as torch does
        momentum = 1.0 / float(module.num_batches_tracked)
    unbiased = var * count / (count - 1).clamp(min=1)
    module.running_mean.mul_(1 - momentum).add_(momentum * mean)
    module.running_var.mul_(1 - momentum).add_(momentum * unbiased)


def sync_batch_norm_twin(module: nn.Module,
                         input: torch.Tensor) -> torch.Tensor:
    """SyncBatchNorm's training forward on CPU tensors: statistics over
    every rank's batch (see the module docstring)."""
    channels = input.shape[1]
    flat = input.transpose(0, 1).reshape(channels, -1)
    count = input.new_full((1, ), float(flat.shape[1]))
    stats = torch.cat([flat.sum(1), (flat * flat).sum(1), count])
    stats = autograd_all_reduce(stats, group=_group(module))
    total = stats[-1]
    mean = stats[:channels] / total
    var = (stats[channels:2 * channels] / total - mean * mean).clamp(min=0)
    if module.training and getattr(module, 'running_mean', None) is not None:
        with torch.no_grad():
            _update_running_stats(module, mean.detach(), var.detach(),
                                  total.detach())
    shape = [1, channels] + [1] * (input.dim() - 2)
    out = (input - mean.view(shape)) * torch.rsqrt(
        var.view(shape) + module.eps)
    if module.weight is not None:
        out = out * module.weight.view(shape) + module.bias.view(shape)
    return out


def _plain_batch_norm(module: nn.Module, input: torch.Tensor) -> torch.Tensor:
    """Eval mode, or no process group: a plain BatchNorm forward."""
    use_batch = module.training or module.running_mean is None
    return nn.functional.batch_norm(
        input, module.running_mean, module.running_var, module.weight,
        module.bias, use_batch, module.momentum or 0.0, module.eps)


def _twin_forward(self, input: torch.Tensor) -> torch.Tensor:
    distributed = dist.is_available() and dist.is_initialized()
    if input.device.type != 'cpu' or not distributed:
        return self._doctor_gpu_forward(input)
    if not self.training:
        return _plain_batch_norm(self, input)
    return sync_batch_norm_twin(self, input)


@contextlib.contextmanager
def sync_batch_norm_on_cpu() -> Iterator[None]:
    """Inside the block, every SyncBatchNorm class runs CPU tensors through
    :func:`sync_batch_norm_twin` (GPU tensors as before)."""
    classes = _sync_batch_norm_classes()
    for cls in classes:
        cls._doctor_gpu_forward = cls.forward
        cls.forward = _twin_forward
    try:
        yield
    finally:
        for cls in classes:
            cls.forward = cls.__dict__['_doctor_gpu_forward']
            del cls._doctor_gpu_forward


def sync_batch_norm_layers(model: nn.Module) -> int:
    classes = tuple(_sync_batch_norm_classes())
    return sum(isinstance(m, classes) for m in model.modules())


def describe_twins(sync_bn_layers: int, precision=None) -> List[str]:
    """One phrase per twin the probe used (``precision``: the
    :class:`~mmddp_ext.utils.precision.Precision` of the probe's optimizer
    wrapper, None without one)."""
    used = []
    if sync_bn_layers:
        used.append(f'{sync_bn_layers} SyncBatchNorm layer(s) ran as the '
                    "doctor's CPU twin (statistics over every rank's batch "
                    'by an all-reduce over gloo)')
    if precision is not None and precision.amp:
        used.append(f'AMP ran as {precision.dtype} autocast on the CPU '
                    '(ExtAmpOptimWrapper, loss scale from 1)')
    used.append('tensors on the CPU')
    return used
