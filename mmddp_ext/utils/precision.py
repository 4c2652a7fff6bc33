"""Full precision for the places of a model that need it under autocast."""
import torch
from torch import Tensor

REDUCED_DTYPES = (torch.float16, torch.bfloat16)


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
