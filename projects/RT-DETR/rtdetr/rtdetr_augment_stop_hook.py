"""RT-DETRv2's augmentation stop epoch as one hook."""
from mmdet.engine.hooks import PipelineSwitchHook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module()
class RTDETRAugmentStopHook(PipelineSwitchHook):
    """``PipelineSwitchHook`` that also stops multi-scale batches.

    Upstream rtdetrv2 stops two things at one epoch: the strong transforms
    (its transforms ``policy: stop_epoch``) and the random batch scale of
    ``BatchImageCollateFunction`` (``stop_epoch``). Here the first is the
    pipeline switch of ``super()``; the second is the
    ``BatchChoiceResize`` of the model's data preprocessor, whose
    ``batch_augments`` this hook clears from ``switch_epoch`` on, so the
    last epochs train at 640 px as upstream.

    Differs from ``PipelineSwitchHook.before_train_epoch`` only by that
    second step, on every rank (each rank owns its model).

    Args:
        switch_epoch (int): First (0-based) epoch without the strong
            transforms and multi-scale batches (upstream ``stop_epoch``).
        switch_pipeline (list[dict]): Train pipeline from then on.
    """

    def before_train_epoch(self, runner) -> None:
        """Switch the pipeline (``super()``) and drop batch augments."""
        super().before_train_epoch(runner)
        if runner.epoch < self.switch_epoch:
            return
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        preprocessor = model.data_preprocessor
        if getattr(preprocessor, 'batch_augments', None):
            preprocessor.batch_augments = None
            print_log(
                f'RTDETRAugmentStopHook: epoch {runner.epoch} on trains '
                'without batch augments (multi-scale stopped).',
                logger='current')
