"""DEIM's flat-cosine learning rate as an MMEngine parameter scheduler."""
import math
from typing import List

from mmengine.optim.scheduler.lr_scheduler import LRSchedulerMixin
from mmengine.optim.scheduler.param_scheduler import INF, _ParamScheduler
from mmengine.registry import PARAM_SCHEDULERS


def flat_cosine_factor(step: int, total_iter: int, warmup_iter: int,
                       flat_iter: int, no_aug_iter: int,
                       lr_gamma: float) -> float:
    """Factor of the base lr that upstream DEIM sets after iteration
    ``step`` (``flat_cosine_schedule`` of ``engine/optim/lr_scheduler.py``):
    a quadratic warm-up to 1 over ``warmup_iter`` iterations, 1 up to
    ``flat_iter``, a half cosine down to ``lr_gamma`` that ends where the
    last ``no_aug_iter`` iterations begin, and ``lr_gamma`` for those."""
    if step <= warmup_iter:
        return (step / float(warmup_iter))**2
    if step <= flat_iter:
        return 1.0
    if step >= total_iter - no_aug_iter:
        return lr_gamma
    progress = (step - flat_iter) / (total_iter - flat_iter - no_aug_iter)
    return lr_gamma + (1 - lr_gamma) * 0.5 * (1 + math.cos(math.pi * progress))


class FlatCosineParamScheduler(_ParamScheduler):
    """Upstream DEIM's ``FlatCosineLRScheduler`` for any optimizer value.

    Upstream steps its scheduler after every optimizer step with the index
    of the iteration just done (``det_engine.py``:
    ``lr_scheduler.step(cur_iters + i, optimizer)``), so iteration ``k``
    trains with the value computed for ``k - 1``: iteration 1 trains with
    0, iteration 2 with ``(1 / warmup_iter) ** 2`` of the base value. The
    first iteration trains with the value the optimizer starts with, which
    in upstream's solver is set by the ``LinearWarmup`` that the YAML
    still builds (its constructor scales every group by ``1 /
    warmup_duration``; the flat-cosine path never steps it again):
    ``start_factor`` here. The minimum is ``lr_gamma`` times each group's
    base value, as upstream's ``min_lrs``.

    Iterations are counted from ``begin``; ``end - begin`` is upstream's
    ``total_iter``. Written in epochs (``by_epoch=True`` with
    ``convert_to_iter_based=True``, upstream's ``epoches``, ``flat_epoch``
    and ``no_aug_epoch``), the epoch keys are multiplied by the train
    loader's length, as upstream multiplies them by
    ``len(train_dataloader)``.

    Args:
        optimizer (Optimizer | BaseOptimWrapper): The optimizer.
        param_name (str): The group key scheduled, e.g. ``'lr'``.
        warmup_iter (int): Iterations of the quadratic warm-up (upstream
            ``warmup_iter``, always in iterations).
        flat_epoch (int): End of the flat part, in epochs once converted
            (upstream ``flat_epoch``); in iterations for ``by_epoch=False``.
        no_aug_epoch (int): Length of the final constant part at
            ``lr_gamma``, in epochs once converted (upstream
            ``no_aug_epoch``); in iterations for ``by_epoch=False``.
        lr_gamma (float): The minimum as a fraction of the base value
            (upstream ``lr_gamma``). Defaults to 0.5.
        start_factor (float): Fraction of the base value the first
            iteration trains with (upstream: ``1 / warmup_duration`` of the
            YAML's ``lr_warmup_scheduler``). Defaults to 1 / 500.
        begin (int): First step scheduled. Defaults to 0.
        end (int): Step after the last one (upstream ``epoches``, converted
            as ``flat_epoch``). Required.
        last_step (int): Index of the last step, for resuming without a
            state dict. Defaults to -1.
        by_epoch (bool): Must be False once built; write the epoch form
            with ``convert_to_iter_based=True``. Defaults to True.
        verbose (bool): Print each value. Defaults to False.
    """

    def __init__(self,
                 optimizer,
                 param_name: str,
                 warmup_iter: int,
                 flat_epoch: int,
                 no_aug_epoch: int,
                 lr_gamma: float = 0.5,
                 start_factor: float = 1 / 500,
                 begin: int = 0,
                 end: int = INF,
                 last_step: int = -1,
                 by_epoch: bool = True,
                 verbose: bool = False) -> None:
        if by_epoch:
            raise ValueError(
                f'{type(self).__name__} changes the value every iteration, '
                'as upstream DEIM does; its flat_epoch, no_aug_epoch and end '
                'are in epochs only through MMEngine\'s conversion. Write '
                'by_epoch=True, convert_to_iter_based=True in the '
                'param_scheduler config (or by_epoch=False with every length '
                'in iterations).')
        if end == INF:
            raise ValueError(
                f'{type(self).__name__} needs end (upstream epoches, the '
                'length of the whole schedule), e.g. end=max_epochs.')
        if warmup_iter <= 0 or flat_epoch < 0 or no_aug_epoch < 0:
            raise ValueError(
                f'{type(self).__name__} needs warmup_iter > 0 and flat_epoch, '
                f'no_aug_epoch >= 0, got warmup_iter={warmup_iter}, '
                f'flat_epoch={flat_epoch}, no_aug_epoch={no_aug_epoch}.')
        self.warmup_iter = warmup_iter
        self.flat_iter = flat_epoch
        self.no_aug_iter = no_aug_epoch
        self.lr_gamma = lr_gamma
        self.start_factor = start_factor
        super().__init__(
            optimizer,
            param_name=param_name,
            begin=begin,
            end=end,
            last_step=last_step,
            by_epoch=False,
            verbose=verbose)

    @classmethod
    def build_iter_from_epoch(cls,
                              *args,
                              flat_epoch: int,
                              no_aug_epoch: int,
                              begin: int = 0,
                              end: int = INF,
                              by_epoch: bool = True,
                              epoch_length: int = None,
                              **kwargs):
        """Build the iteration-based scheduler from the epoch-based config
        (``convert_to_iter_based=True``): ``flat_epoch``, ``no_aug_epoch``,
        ``begin`` and ``end`` times ``epoch_length``."""
        if not by_epoch or not epoch_length or epoch_length <= 0:
            raise ValueError(
                'convert_to_iter_based needs by_epoch=True and the train '
                f'loader\'s length, got by_epoch={by_epoch}, '
                f'epoch_length={epoch_length}.')
        if end == INF:
            end_iter = INF
        else:
            end_iter = int(end * epoch_length)
        return cls(
            *args,
            flat_epoch=int(flat_epoch * epoch_length),
            no_aug_epoch=int(no_aug_epoch * epoch_length),
            begin=int(begin * epoch_length),
            end=end_iter,
            by_epoch=False,
            **kwargs)

    def _get_value(self) -> List[float]:
        """The value of iteration ``last_step`` (see the class doc)."""
        if self.last_step == 0:
            factor = self.start_factor
        else:
            factor = flat_cosine_factor(self.last_step - 1,
                                        self.end - self.begin,
                                        self.warmup_iter, self.flat_iter,
                                        self.no_aug_iter, self.lr_gamma)
        return [base * factor for base in self.base_values]


@PARAM_SCHEDULERS.register_module()
class FlatCosineLR(LRSchedulerMixin, FlatCosineParamScheduler):
    """Upstream DEIM's flat-cosine learning rate (see
    :class:`FlatCosineParamScheduler`)::

        param_scheduler = [
            dict(type='FlatCosineLR', warmup_iter=2000, flat_epoch=29,
                 no_aug_epoch=8, lr_gamma=0.5, start_factor=1 / 500,
                 begin=0, end=58, by_epoch=True,
                 convert_to_iter_based=True)
        ]
    """
