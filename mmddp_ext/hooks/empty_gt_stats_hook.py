import functools
import logging
from typing import Any, Dict, List, Optional, Sequence, Set

import torch
from mmengine.dist import all_gather
from mmengine.hooks import Hook, LoggerHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from ..datasets.empty_gt_guard_collate import (GUARD_MARK_KEY,
                                               check_guard_args,
                                               empty_gt_guard_collate,
                                               num_gt_instances)

# Order of the per-rank counters in the gathered tensor.
COUNT_NAMES = ('samples', 'empty_samples', 'all_empty_batches', 'swaps',
               'fallbacks')
# The counters that are logged (``samples`` only feeds ``empty_ratio``).
LOGGED_COUNTS = COUNT_NAMES[1:]
SCALAR_PREFIX = 'train/empty_gt/'
DEFAULT_INTERVAL = 50


def _is_guard(collate_cfg: Any) -> bool:
    """Whether a ``collate_fn`` config (dict or callable) is the guard."""
    fn = collate_cfg
    if isinstance(fn, dict):
        fn = fn.get('type')
    if isinstance(fn, functools.partial):
        fn = fn.func
    return fn == 'empty_gt_guard_collate' or fn is empty_gt_guard_collate


def _loader_cfg(cfg: Any, name: str) -> dict:
    loader = cfg.get(name)
    return loader if isinstance(loader, dict) else {}


def _guard_mark(samples: Sequence) -> dict:
    """The guard's mark on a batch (on each sample of an all-empty one)."""
    for sample in samples:
        mark = getattr(sample, GUARD_MARK_KEY, None)
        if mark:
            return mark
    return {}


def _data_samples(data_batch: Any) -> Optional[Sequence]:
    if isinstance(data_batch, dict):
        samples = data_batch.get('data_samples')
        if isinstance(samples, (list, tuple)):
            return samples
    return None


@HOOKS.register_module()
class EmptyGTStatsHook(Hook):
    """Log, per rank, how many training samples and batches have no GT.

    After every training iteration the hook counts the GT instances of
    each data sample of the batch itself, so it works with any collate
    function; with :func:`empty_gt_guard_collate` it also reads the mark
    the guard leaves on all-empty batches. At the logging interval the
    counters of all ranks are all-gathered (five integers per rank; every
    rank calls it at the same iterations, as LoggerHook's interval is the
    same everywhere) and written to ``runner.message_hub`` as
    ``train/empty_gt/...`` scalars, which ``LoggerHook`` prints on rank 0
    and sends to the visualizer:

    - ``empty_gt/rank{r}_empty_samples``: samples drawn from the dataset
      without a GT box (before any swap), so it shows how empty the data
      is, whatever the policy.
    - ``empty_gt/rank{r}_all_empty_batches``: batches drawn with no GT box
      in any sample (before any swap).
    - ``empty_gt/rank{r}_swaps``: all-empty batches in which the guard
      swapped in an annotated sample.
    - ``empty_gt/rank{r}_fallbacks``: all-empty batches the ``'swap'``
      guard passed through because its reservoir was still empty.
    - ``empty_gt/empty_ratio``: empty samples / samples, all ranks.

    Rank 0 logs every rank's counters, rather than each rank logging its
    own, because MMEngine writes only rank 0's log by default; an empty
    shard on rank 3 is exactly what must be visible there. The counters
    are totals since this process started training (a resumed run starts
    again from 0), and only training iterations are counted. When training
    ends, rank 0 logs a one-line summary per rank.

    The hook also checks the dataloader configs before training: an
    invalid guard config for ``train_dataloader`` raises ``ValueError``
    before the first iteration (rather than from inside a DataLoader
    worker), and so does the guard configured for ``val_dataloader`` or
    ``test_dataloader``, whose batches must not be altered.

    Args:
        interval (int, optional): Gather and publish the counters every
            ``interval`` training iterations (and at the end of an epoch).
            Defaults to None: the interval of the runner's ``LoggerHook``,
            so the counters are fresh in each logged line (50 without a
            ``LoggerHook``).
        per_rank (bool): Log each rank's counters as shown above. With
            False, log their sums over ranks as ``empty_gt/empty_samples``
            and so on, which keeps the log line short on many ranks.
            Defaults to True.
    """

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) formats the line

    def __init__(self,
                 interval: Optional[int] = None,
                 per_rank: bool = True) -> None:
        if interval is not None and (isinstance(interval, bool)
                                     or not isinstance(interval, int)
                                     or interval < 1):
            raise ValueError(
                'EmptyGTStatsHook: interval must be None (follow the '
                "LoggerHook's interval) or an int >= 1, but got "
                f'{interval!r} ({type(interval).__name__}).')
        if not isinstance(per_rank, bool):
            raise ValueError(
                'EmptyGTStatsHook: per_rank must be True (log every rank) '
                'or False (log sums over ranks), but got '
                f'{per_rank!r} ({type(per_rank).__name__}).')
        self.interval = interval
        self.per_rank = per_rank
        self._interval = interval or DEFAULT_INTERVAL
        self._counts = dict.fromkeys(COUNT_NAMES, 0)
        self._reported_fallback_ranks: Set[int] = set()

    def before_train(self, runner) -> None:
        self._check_dataloader_configs(runner)
        if self.interval is None:
            logger_hooks = [
                h for h in runner.hooks if isinstance(h, LoggerHook)
            ]
            if logger_hooks:
                self._interval = logger_hooks[0].interval

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Any = None,
                         outputs: Optional[dict] = None) -> None:
        self.count_batch(data_batch)
        if (self.every_n_inner_iters(batch_idx, self._interval)
                or self.end_of_epoch(runner.train_dataloader, batch_idx)):
            self._publish(runner, self.gather_counts())

    def after_train(self, runner) -> None:
        per_rank = self.gather_counts()
        lines = [
            f'  rank {rank}: {c["empty_samples"]}/{c["samples"]} samples '
            f'without GT, {c["all_empty_batches"]} all-empty batches, '
            f'{c["swaps"]} swaps, {c["fallbacks"]} fallbacks'
            for rank, c in enumerate(per_rank)
        ]
        print_log(
            'EmptyGTStatsHook: training batches without GT boxes\n' +
            '\n'.join(lines),
            logger='current')

    def count_batch(self, data_batch: Any) -> None:
        """Add one training batch (``pseudo_collate`` output) to the
        counters of this rank; batches without GT annotations are
        skipped."""
        samples = _data_samples(data_batch)
        if not samples:
            return
        gt_counts = [num_gt_instances(sample) for sample in samples]
        if None in gt_counts:
            return
        mark = _guard_mark(samples)
        seen_empty = sum(1 for count in gt_counts if count == 0)
        swapped = bool(mark.get('swapped'))
        counts = self._counts
        counts['samples'] += len(samples)
        # A swap replaced one empty sample: add it back to see the data.
        counts['empty_samples'] += seen_empty + swapped
        counts['all_empty_batches'] += int(seen_empty == len(samples)
                                           or bool(mark.get('all_empty')))
        counts['swaps'] += swapped
        counts['fallbacks'] += bool(mark.get('fallback'))

    def gather_counts(self) -> List[Dict[str, int]]:
        """Every rank's counters, in rank order (a collective call)."""
        local = torch.tensor([self._counts[name] for name in COUNT_NAMES],
                             dtype=torch.int64)
        return [
            dict(zip(COUNT_NAMES, (int(v) for v in values.tolist())))
            for values in all_gather(local)
        ]

    def _publish(self, runner, per_rank: List[Dict[str, int]]) -> None:
        hub = runner.message_hub
        if self.per_rank:
            for rank, counts in enumerate(per_rank):
                for name in LOGGED_COUNTS:
                    hub.update_scalar(f'{SCALAR_PREFIX}rank{rank}_{name}',
                                      counts[name])
        else:
            for name in LOGGED_COUNTS:
                hub.update_scalar(f'{SCALAR_PREFIX}{name}',
                                  sum(c[name] for c in per_rank))
        samples = sum(c['samples'] for c in per_rank)
        empty = sum(c['empty_samples'] for c in per_rank)
        hub.update_scalar(f'{SCALAR_PREFIX}empty_ratio',
                          empty / samples if samples else 0.0)
        self._warn_on_new_fallbacks(per_rank)

    def _warn_on_new_fallbacks(self, per_rank: List[Dict[str, int]]) -> None:
        new = [
            rank for rank, c in enumerate(per_rank)
            if c['fallbacks'] and rank not in self._reported_fallback_ranks
        ]
        if not new:
            return
        self._reported_fallback_ranks.update(new)
        print_log(
            f'EmptyGTStatsHook: rank(s) {new} trained on all-empty batches '
            "that empty_gt_guard_collate(policy='swap') could not fix: its "
            'reservoir had no annotated sample yet. A few at the start are '
            'expected; a count that keeps growing means that rank sees no '
            'boxes at all (shuffle the sampler, or use a DDP-safe head).',
            logger='current',
            level=logging.WARNING)

    @staticmethod
    def _check_dataloader_configs(runner) -> None:
        cfg = getattr(runner, 'cfg', None) or {}
        for name in ('val_dataloader', 'test_dataloader'):
            if _is_guard(_loader_cfg(cfg, name).get('collate_fn')):
                raise ValueError(
                    f'{name}.collate_fn is empty_gt_guard_collate, which '
                    'is for training only: evaluation batches must not be '
                    f'altered. Remove collate_fn from {name} (the default '
                    "is dict(type='pseudo_collate')).")
        collate_cfg = _loader_cfg(cfg, 'train_dataloader').get('collate_fn')
        if isinstance(collate_cfg, dict) and _is_guard(collate_cfg):
            guard_args = dict(collate_cfg)
            guard_args.pop('type')
            check_guard_args(**guard_args)
