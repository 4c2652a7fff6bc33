"""Host-to-device copies that leave the device's queue running."""
import torch
from torch import Tensor


def host_to_device(data, device, dtype=None) -> Tensor:
    """``data`` (a list, NumPy array or CPU tensor) as a tensor on
    ``device``, without making the host wait for the device.

    PyTorch copies pageable host memory to a CUDA device synchronously:
    the host waits until every kernel queued before the copy has run
    (``Tensor.new_tensor`` and ``torch.tensor(..., device=...)`` do this
    too), so work the host could queue meanwhile starts late. A copy from
    pinned memory with ``non_blocking=True`` is queued like a kernel
    instead; PyTorch keeps the pinned block alive until the copy has run.
    Other devices get a plain copy.

    Args:
        data (list | numpy.ndarray | Tensor): Host data.
        device (torch.device | str): Target device.
        dtype (torch.dtype, optional): Dtype of the result. Defaults to
            None, i.e. inferred from ``data``.

    Returns:
        Tensor: The data on ``device``.
    """
    # On the host even under a CUDA default device (torch.set_default_device,
    # as the GPU test ranks run): pin_memory takes CPU tensors only.
    host = torch.as_tensor(data, dtype=dtype, device='cpu')
    device = torch.device(device)
    if device.type != 'cuda':
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
