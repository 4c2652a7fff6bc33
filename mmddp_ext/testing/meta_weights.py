"""Build a model's modules with shapes but no memory."""
import contextlib
from typing import Iterator

import torch
import torch.nn as nn


@contextlib.contextmanager
def weights_on_meta() -> Iterator[None]:
    """Build modules with every parameter and buffer moved to the meta
    device as it is registered: shapes without memory. Unlike
    ``torch.device('meta')``, code that reads a value while building (mmdet's
    SwinTransformer calls ``.item()`` on its drop-path schedule) works."""
    register_parameter = nn.Module.register_parameter
    register_buffer = nn.Module.register_buffer

    def parameter_on_meta(module, name, param):
        if param is not None:
            param = nn.Parameter(
                param.to('meta'), requires_grad=param.requires_grad)
        register_parameter(module, name, param)

    def buffer_on_meta(module, name, tensor, persistent=True):
        if isinstance(tensor, torch.Tensor):
            tensor = tensor.to('meta')
        register_buffer(module, name, tensor, persistent=persistent)

    nn.Module.register_parameter = parameter_on_meta
    nn.Module.register_buffer = buffer_on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter
        nn.Module.register_buffer = register_buffer
