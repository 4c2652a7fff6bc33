"""Every private torch interface the package calls, in one place.

Checked against torch 2.1 to 2.13 (the CPU CI runs 2.13.0, the GPU
figures 2.11.0+cu130). When torch changes one of these, this is the only
file to read; each function says what it reaches and why no public
interface does the same.
"""
from typing import Callable, List, Optional, Sequence, TypeVar

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.dropout import _DropoutNd
from torch.nn.parallel import DistributedDataParallel

# Base classes of every BatchNorm (1d/2d/3d, SyncBatchNorm, mmcv's and
# mmdet's subclasses) and every dropout layer: the only common ancestor
# torch gives them (MMCV and MMDetection test against the same names).
BatchNormBase = _BatchNorm
DropoutBase = _DropoutNd
T = TypeVar('T')


def default_store() -> Optional[dist.Store]:
    """The default process group's key-value store (the ``TCPStore`` the
    launcher's rendezvous made), or None when there is none.

    ``torch.distributed.distributed_c10d._get_default_store`` (private in
    every release so far); the store is how ranks talk outside collectives
    (side channel, heartbeats, restart decisions) without a second
    rendezvous.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):
        return None


def group_timeout(group) -> Optional[object]:
    """The collective timeout a process group was created with, or None.

    Read through the group's backend options
    (``ProcessGroup._get_backend(device).options._timeout``); torch has no
    public getter.
    """
    for device in ('cpu', 'cuda'):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (AttributeError, RuntimeError, ValueError):
            continue
    return None


def queue_end_of_backward(callback: Callable[[], None]) -> None:
    """Run ``callback`` once the current backward pass has finished (all
    gradients accumulated), as DDP's reducer finalises its buckets.

    ``Variable._execution_engine.queue_callback``: the engine callback
    DDP itself uses; only valid while a backward pass runs.
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def ignore_in_ddp(module: torch.nn.Module, names: Sequence[str]) -> None:
    """Make the next ``DistributedDataParallel(module)`` leave out the
    named parameters and buffers (no broadcast, no gradient bucket).

    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``
    (a documented-in-source static method, underscore-named).
    """
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        module, list(names))


def collective_sequence_number(group) -> int:
    """How many collectives this rank has issued on ``group``.

    ``ProcessGroup._get_sequence_number_for_group``: the counter gloo and
    NCCL keep for their desync debugging; torch has no public one. Raises
    RuntimeError or AttributeError where the backend keeps none.
    """
    return int(group._get_sequence_number_for_group())


def post_accumulate_grad_hooks(param: torch.Tensor) -> Optional[dict]:
    """The live dict of the hooks ``register_post_accumulate_grad_hook``
    added to ``param`` (``Tensor._post_accumulate_grad_hooks``; None
    before the first).

    Clearing and refilling it switches the hooks off and on again without
    the handles, which only their owner holds (a benchmark times steps
    with and without AutoDDP's hooks this way).
    """
    return param._post_accumulate_grad_hooks


def reducer_params(ddp: DistributedDataParallel) -> List[torch.nn.Parameter]:
    """The parameters DDP's reducer holds (waits for a gradient of), in
    the reducer's own order.

    ``DistributedDataParallel._build_params_for_reducer`` recomputes the
    list DDP built its reducer from (trainable, not ignored, not shared).
    """
    params, _ = ddp._build_params_for_reducer()
    return list(params)


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous 1-D tensor holding ``tensors`` (one collective for
    many tensors, as DDP's buckets; ``torch._utils``)."""
    return _flatten_dense_tensors(tensors)


def unflatten(flat: torch.Tensor,
              like: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """Views of ``flat`` shaped as ``like`` (``torch._utils``)."""
    return list(_unflatten_dense_tensors(flat, like))


def tensor_version(tensor: torch.Tensor) -> int:
    """The tensor's version counter (``Tensor._version``), which every
    in-place write raises: autograd's own test for "modified since saved".
    Caches of values derived from parameters (folded conv weights) use it
    to see an optimizer step, an EMA update or ``load_state_dict``."""
    return tensor._version


def cached_until_written(owner: object, slot: str,
                         sources: Sequence[Optional[torch.Tensor]],
                         make: Callable[[], T]) -> T:
    """``make()``, kept in ``owner.__dict__[slot]`` and reused while every
    tensor of ``sources`` is the same tensor, storage, device, dtype and
    version (:func:`tensor_version`) as when it was made.

    The one cache of values derived from parameters and buffers (folded
    conv weights, D-FINE's bin values): an optimizer step, an EMA
    update, ``load_state_dict``, a deep copy or a move to another device
    or dtype remakes the value on the next call. One entry per slot, held
    as a plain attribute, not a buffer: never saved, never synced.
    Inference tensors have no version counter; with one among
    ``sources``, every call makes the value afresh.
    """
    try:
        key = tuple((id(t), t.data_ptr(), t.device, t.dtype,
                     tensor_version(t)) if t is not None else None
                    for t in sources)
    except RuntimeError:
        return make()
    hit = owner.__dict__.get(slot)
    if hit is None or hit[0] != key:
        hit = (key, make())
        owner.__dict__[slot] = hit
    return hit[1]


def onednn_conv2d(x: torch.Tensor, weight: torch.Tensor,
                  bias: Optional[torch.Tensor], stride: Sequence[int],
                  padding: Sequence[int], dilation: Sequence[int],
                  groups: int) -> torch.Tensor:
    """``F.conv2d``'s forward run by oneDNN whatever torch's kernel choice
    would be (``torch.mkldnn_convolution``, undocumented; its backward is
    torch's ``convolution_backward``). For a 1x1 conv of a batch under 16
    on one thread, or of one small image, torch picks its own im2col +
    GEMM (``ConvParams::use_mkldnn``), slower on the CPUs measured (see
    ``projects/RT-DETR/rtdetr/pointwise_conv.py``)."""
    return torch.mkldnn_convolution(x, weight, bias, list(padding),
                                    list(stride), list(dilation), groups)


def onednn_runs(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether :func:`onednn_conv2d` can run this conv: a dense float32
    CPU input and weight, and oneDNN built in and switched on, outside a
    trace (an ONNX export, ``torch.jit.trace``), whose graph must hold
    the portable convolution: ``mkldnn_convolution`` has no ONNX
    symbolic."""
    return (not torch.jit.is_tracing() and x.device.type == 'cpu'
            and x.dtype == torch.float32 and weight.dtype == torch.float32
            and x.layout == torch.strided and not weight.is_mkldnn
            and torch.backends.mkldnn.is_available()
            and torch.backends.mkldnn.enabled)


def stop_loader_workers(loader_or_iterator: object) -> bool:
    """Stop the worker processes behind a dataloader iterator, or behind
    the iterator a ``DataLoader`` with ``persistent_workers`` keeps, now;
    whether there were any.

    ``_MultiProcessingDataLoaderIter._shutdown_workers`` and
    ``DataLoader._iterator`` (private in every release so far). An
    iterator left to the garbage collector inside a reference cycle (a
    runner's loops and hooks, a traceback) is stopped there, after the
    collector has already closed its index queues: the workers never get
    the request to stop, and the collection waits 5 s per worker before
    killing them.
    """
    iterator = loader_or_iterator
    if isinstance(loader_or_iterator, torch.utils.data.DataLoader):
        iterator = loader_or_iterator._iterator
        loader_or_iterator._iterator = None
    stop = getattr(iterator, '_shutdown_workers', None)
    if stop is None:
        return False
    stop()
    return True
