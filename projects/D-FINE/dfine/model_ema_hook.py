"""``EMAHook`` whose average starts from the model that training starts
with, as upstream D-FINE / DEIM build their ``ModelEMA``."""
from mmengine.hooks import EMAHook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class ModelEMAHook(EMAHook):
    """``EMAHook`` for :class:`ModelEMA`.

    Upstream builds its ``ModelEMA`` after the model is initialised and
    after fine-tuning weights are loaded (``tuning``), so the average
    starts from the weights training starts from. ``EMAHook.before_run``
    copies the model earlier, before ``Runner`` initialises the weights
    and loads ``load_from``; MMEngine's averaged models hide that by
    copying the model at their first update, which :class:`ModelEMA` does
    not (it averages, as upstream). So here, before the first epoch, an
    average that has never been updated (``steps == 0``: a fresh run, or a
    checkpoint saved before any update) takes the model's current state;
    a resumed average (``steps > 0``, loaded by
    ``EMAHook.after_load_checkpoint``) is kept as it is.

    Differs from ``EMAHook.before_train`` by that copy only.

    Args:
        ema_type (str): The averaged model. Defaults to ``'ModelEMA'``.
        **kwargs: Other keys of ``EMAHook`` (``strict_load``,
            ``begin_iter``, ``begin_epoch``) and of the averaged model
            (``decay``, ``warmups``, ``update_buffers``).
    """

    def __init__(self, ema_type: str = 'ModelEMA', **kwargs) -> None:
        super().__init__(ema_type=ema_type, **kwargs)

    def before_train(self, runner) -> None:
        """Check the begin epoch/iteration (``super()``), then start a
        never-updated average from the model's current state."""
        super().before_train(runner)
        if int(self.ema_model.steps) == 0:
            self.ema_model.module.load_state_dict(self.src_model.state_dict())
