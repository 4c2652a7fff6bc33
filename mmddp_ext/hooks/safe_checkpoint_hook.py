from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..utils.checkpoint_safety import restore_history_buffers, to_plain


@HOOKS.register_module()
class SafeCheckpointHook(Hook):
    """Write checkpoints that ``torch.load(weights_only=True)`` accepts.

    Before a checkpoint is saved, the message hub's ``HistoryBuffer``
    objects and any numpy values are converted to tensors and plain Python
    types (see :func:`mmddp_ext.utils.checkpoint_safety.to_plain`); values
    of any other type are dropped with a warning that names them. After a
    checkpoint is loaded, and before the runner hands it to the message hub,
    the history buffers are rebuilt, so ``--resume`` restores the logged
    history exactly.

    :class:`mmddp_ext.runner.ExtRunner` registers this hook itself; add it
    to ``custom_hooks`` only when using another runner.
    """

    # Runs after every other hook has added what it saves.
    priority = 'VERY_LOW'

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        dropped = []
        plain = to_plain(
            checkpoint, on_drop=lambda path, obj: dropped.append(
                f'{path} ({type(obj).__name__})'))
        checkpoint.clear()
        checkpoint.update(plain)
        if dropped:
            print_log(
                'mmddp_ext: not saved in the checkpoint because they are not '
                'tensors or plain Python values (weights_only loading would '
                f"refuse them): {', '.join(dropped)}",
                logger='current',
                level=30)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        restore_history_buffers(checkpoint.get('message_hub', {}))
