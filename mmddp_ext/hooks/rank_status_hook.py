import datetime
import time
from typing import Dict, Optional

import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ..utils.torch_private import default_store

STATUS_KEY = 'mmddp_ext/rank_status/{rank}'


def _store():
    """The default process group's key-value store, or None."""
    return default_store()


def read_rank_status(world_size: int,
                     timeout_s: float = 5.0) -> Dict[int, str]:
    """Each rank's last reported ``'iter N, <phase>, Xs ago'``, as far as
    the store can still be read."""
    store = _store()
    if store is None:
        return {}
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    status = {}
    now = time.time()
    for rank in range(world_size):
        key = STATUS_KEY.format(rank=rank)
        try:
            if not store.check([key]):
                status[rank] = 'no status reported'
                continue
            iteration, phase, stamp = store.get(key).decode().split('|')
            status[rank] = (f'iter {iteration}, {phase}, '
                            f'{now - float(stamp):.0f}s ago')
        except (RuntimeError, ValueError) as error:
            status[rank] = f'unknown ({type(error).__name__})'
    return status


def trained_iters(runner) -> int:
    """``runner.iter`` where the runner has its training loop; 0 for one
    that only validates or tests. ``runner.iter`` builds the training loop,
    and with it the training dataloader and dataset, on a runner that has
    none yet (``runner.val()`` or ``runner.test()`` on their own);
    MMEngine's own ``LoggerHook`` and ``LogProcessor`` check the same way."""
    loop = getattr(runner, '_train_loop', None)
    if loop is None or isinstance(loop, dict):
        return 0
    return runner.iter


@HOOKS.register_module()
class RankStatusHook(Hook):
    """Publish each rank's iteration and phase in the process group's store.

    When a collective times out, :class:`mmddp_ext.runner.ExtRunner` reads
    these entries and names, for every rank, the last iteration and phase
    it reached, instead of torch's bare timeout message. Each update is one
    small write to the store (about a tenth of a millisecond), at the start
    and end of every train iteration and around validation and checkpoint
    saving. ``ExtRunner`` registers this hook itself. A runner that only
    validates or tests reports iteration 0 (:func:`trained_iters`): it
    builds no training loop or dataset for this hook.
    """

    priority = 'HIGHEST'

    def __init__(self) -> None:
        self._store = None
        self._key: Optional[str] = None

    def _report(self, iteration: int, phase: str) -> None:
        if self._key is None:
            self._store = _store()
            if self._store is None:
                return
            self._key = STATUS_KEY.format(rank=dist.get_rank())
        self._store.set(self._key, f'{iteration}|{phase}|{time.time()}')

    def before_train(self, runner) -> None:
        self._report(runner.iter, 'starting training')

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._report(runner.iter + 1, 'train step (forward/backward/step)')

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self._report(runner.iter + 1, 'after train step (hooks)')

    def before_val(self, runner) -> None:
        self._report(trained_iters(runner), 'validation')

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        self._report(trained_iters(runner), 'saving checkpoint')
