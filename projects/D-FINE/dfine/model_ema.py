"""Upstream D-FINE / DEIM / RT-DETR ``ModelEMA`` as an MMEngine averaged
model."""
from typing import Optional

import torch
import torch.nn as nn
from mmdet.models.layers import ExpMomentumEMA
from mmdet.registry import MODELS


@MODELS.register_module()
class ModelEMA(ExpMomentumEMA):
    """Exponential moving average of every floating-point parameter and
    buffer, with upstream's warm-up of the decay.

    Upstream (``src/optim/ema.py`` of D-FINE, ``engine/optim/ema.py`` of
    DEIM) keeps a copy of the model made before training and, after every
    optimizer step ``u = 1, 2, ...``, sets each floating-point entry of
    the state dict to ``d * ema + (1 - d) * model`` with
    ``d = decay * (1 - exp(-u / warmups))``. mmdet's ``ExpMomentumEMA``
    with ``momentum = 1 - decay`` and ``gamma = warmups`` uses the same
    ``d`` for its update ``steps = u - 1``, except the first: MMEngine's
    ``BaseAveragedModel.update_parameters`` copies the model at
    ``steps == 0`` instead of averaging. This class averages there too
    (``d = decay * (1 - exp(-1 / warmups))``), so the first update keeps
    upstream's small share of the starting weights; the copy it averages
    with is the model at the start of training, which
    :class:`ModelEMAHook` puts in place.

    Differs from ``BaseAveragedModel.update_parameters`` only at
    ``steps == 0``. Integer buffers (BatchNorm's ``num_batches_tracked``)
    are not averaged, as upstream.

    Args:
        model (nn.Module): The model averaged.
        decay (float): Upstream ``ema.decay``. Defaults to 0.9999.
        warmups (int): Upstream ``ema.warmups``: updates over which the
            decay ramps up. Defaults to 1000 (D-FINE, DEIM-D-FINE; 2000 in
            DEIM-RTDETRv2 and RT-DETR).
        interval (int): Update every ``interval`` steps (upstream: 1).
            Defaults to 1.
        device (torch.device, optional): Where the average lives. Defaults
            to None (the model's device).
        update_buffers (bool): Average the buffers too (upstream averages
            the whole state dict). Defaults to True.
    """

    def __init__(self,
                 model: nn.Module,
                 decay: float = 0.9999,
                 warmups: int = 1000,
                 interval: int = 1,
                 device: Optional[torch.device] = None,
                 update_buffers: bool = True) -> None:
        if not 0 < decay < 1 or warmups <= 0:
            raise ValueError(
                'ModelEMA needs 0 < decay < 1 and warmups > 0 (upstream '
                f'ema.decay and ema.warmups), got decay={decay}, '
                f'warmups={warmups}.')
        super().__init__(
            model,
            momentum=1 - decay,
            gamma=warmups,
            interval=interval,
            device=device,
            update_buffers=update_buffers)
        self.decay = decay
        self.warmups = warmups

    def update_parameters(self, model: nn.Module) -> None:
        """Average ``model`` into the copy (see the class doc)."""
        if int(self.steps) != 0:
            super().update_parameters(model)
            return
        source = (
            model.state_dict()
            if self.update_buffers else dict(model.named_parameters()))
        for key, averaged in self.avg_parameters.items():
            if averaged.dtype.is_floating_point:
                self.avg_func(averaged.data,
                              source[key].data.to(averaged.device), 0)
        if not self.update_buffers:
            for ema_buffer, buffer in zip(self.module.buffers(),
                                          model.buffers()):
                ema_buffer.data.copy_(buffer.data.to(ema_buffer.device))
        self.steps += 1
