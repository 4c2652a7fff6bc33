"""Exact resume: a run stopped at any iteration and resumed ends where the
uninterrupted run ends.

What it takes, and where each part lives:

- the position in the data: the batch sampler skips what the checkpoint
  trained by index (:class:`~mmddp_ext.datasets.ResumableBatchSampler`),
  driven by the resumable loops (``ResumableEpochBasedTrainLoop``,
  ``ResumableIterBasedTrainLoop``) from the position the checkpoint
  records (:data:`META_KEY`);
- augmentation randomness that does not depend on the worker process:
  each sample and batch is seeded from the run's seed, its training batch
  and its index (:mod:`mmddp_ext.datasets.seeded_samples`);
- the random numbers of the training step: the loops seed the global
  generators from ``(seed, iteration, rank)`` before each iteration
  (:func:`reseed_step`), so they are a function of where the run is, not
  of what ran before in the process (an evaluation, a restart): nothing
  to save, and nothing that a world of other ranks must send to rank 0;
- the seed: MMEngine takes the checkpoint's when the config sets none,
  after the sampler was built with another one; :func:`resume_data`
  gives the sampler the resumed seed.

Learning rates, momentum, EMA and the counters are MMEngine's own resume
(optimizer, schedulers, hooks' state, message hub).

``ExtRunner`` applies it unless ``mmddp_ext_cfg.exact_resume=False``:
:func:`resumable_loop_cfg` and :func:`resumable_loader_cfg` rewrite the
config before the loop is built, :func:`position_meta` adds the position
to each checkpoint, and :func:`resume_data` moves a resumed run there.
"""
import copy
import logging
from typing import Any, Dict, Optional, Tuple

from mmengine.dist import get_rank, get_world_size
from mmengine.logging import print_log
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from ..datasets.seeded_samples import (SeededFetch, install_seeded_samples,
                                       seed_global_generators, step_seed)
from ..utils.text import log_on_every_rank

META_KEY = 'exact_resume'
_STEP_TAGS = dict(epoch=0, iter=1)
# Loop types the config may name, and the resumable loop built instead.
_RESUMABLE_LOOPS = {
    EpochBasedTrainLoop: 'ResumableEpochBasedTrainLoop',
    IterBasedTrainLoop: 'ResumableIterBasedTrainLoop',
}


def reseed_step(runner, tag: str, number: int) -> None:
    """Seed the global generators for epoch or iteration ``number`` of
    ``runner``'s run on this rank."""
    seed_global_generators(
        step_seed(runner.seed, _STEP_TAGS[tag], number, get_rank()))


def resumable_loop_cfg(loop: Any) -> Any:
    """The train loop config with MMEngine's epoch or iteration loop
    replaced by its resumable subclass; any other loop as it is."""
    if not isinstance(loop, dict):
        return loop
    from mmengine.registry import LOOPS
    if 'type' not in loop and 'by_epoch' not in loop:
        return loop  # MMEngine's own error names what is missing
    loop = copy.copy(loop)
    loop_type = loop.get('type')
    if loop_type is None:
        by_epoch = loop.pop('by_epoch')
        loop_type = EpochBasedTrainLoop if by_epoch else IterBasedTrainLoop
    cls = LOOPS.get(loop_type) if isinstance(loop_type, str) else loop_type
    loop['type'] = _RESUMABLE_LOOPS.get(cls, loop_type)
    return loop


def resumable_loader_cfg(loader: Any) -> Any:
    """The train dataloader config with its batch sampler (or the
    DataLoader's default grouping, with its ``drop_last``) inside a
    ``ResumableBatchSampler``; a built DataLoader as it is."""
    if not isinstance(loader, dict):
        return loader
    inner = loader.get('batch_sampler')
    if isinstance(inner,
                  dict) and inner.get('type') in ('ResumableBatchSampler', ):
        return loader
    loader = dict(loader)
    loader['batch_sampler'] = dict(
        type='ResumableBatchSampler',
        batch_sampler=inner,
        drop_last=loader.pop('drop_last', False))
    return loader


def is_resumable(loop) -> bool:
    return hasattr(loop, 'resume_at') and hasattr(loop, 'batches_in_epoch')


def prepare_loop(loop, seed: int) -> None:
    """Seed the samples of a resumable loop's dataloader by key (before
    its first iterator)."""
    if is_resumable(loop):
        install_seeded_samples(loop.dataloader, seed)


def position_meta(loop, meta: Optional[dict], epoch: int,
                  iteration: int) -> Dict[str, Any]:
    """``meta`` with the position a checkpoint that continues at ``(epoch,
    iteration)`` resumes from (MMEngine's ``meta['epoch']`` and
    ``meta['iter']``)."""
    meta = dict(meta or {})
    if is_resumable(loop):
        meta[META_KEY] = dict(
            batches_in_epoch=loop.batches_in_epoch(epoch, iteration),
            world_size=get_world_size(),
            batch_size=_batch_size(loop))
    return meta


def _batch_size(loop) -> int:
    """Images per batch on one rank of ``loop``'s dataloader."""
    loader = loop.dataloader
    size = getattr(loader.batch_sampler, 'batch_size', None)
    return size or loader.batch_size


def same_samples_position(position: int, recorded: dict, world_size: int,
                          batch_size: int) -> Tuple[int, Optional[str]]:
    """The position, in this run's batches per rank, after the samples a
    checkpoint's ``position`` trained, and what differs (None when the
    checkpoint's world size and batch size are this run's).

    The samplers MMEngine builds (``DefaultSampler``, ``InfiniteSampler``)
    deal one shuffled order of the whole pass to the ranks round robin,
    so ``b`` batches on each of ``W`` ranks of ``B`` images have trained
    the order's first ``b * W * B`` samples, whatever ``W`` and ``B``
    are. A run resumed on another number of ranks or another batch size
    continues after the last whole batch of its own inside them: none of
    the pass's samples is left out, and fewer than one global batch of
    them is trained again. Exactness (the same samples in the same
    batches, the same augmentation) needs the same world size and batch
    size. A batch sampler that regroups indices (``AspectRatioBatchSampler``)
    deals them in another order, so there this is an approximation.

    Args:
        position (int): Batches per rank the checkpoint trained.
        recorded (dict): The checkpoint's :data:`META_KEY` record.
        world_size (int): Ranks of this run.
        batch_size (int): Images per batch on a rank of this run.
    """
    before = (recorded.get('world_size'), recorded.get('batch_size'))
    if None in before or before == (world_size, batch_size):
        return position, None
    samples = position * before[0] * before[1]
    converted = samples // (world_size * batch_size)
    again = samples - converted * world_size * batch_size
    return converted, (
        f'the checkpoint was written by {before[0]} rank(s) of {before[1]} '
        f'image(s) per batch, and this run has {world_size} of '
        f'{batch_size}: the first {samples} samples of the sampler\'s '
        'order it trained (in this epoch; in the run, for an iteration '
        f'loop) are {converted} batch(es) per rank here, so {again} of '
        'them are trained again and none is left out (exact resume, the '
        'same batches and augmentation, needs the same world size and '
        'batch size)')


def resume_data(runner, meta: dict, seed_before: int) -> None:
    """Move a run resumed from a checkpoint with ``meta`` to the data
    position and seeds of the uninterrupted run.

    Args:
        runner: The runner, after ``Runner.resume``.
        meta (dict): The checkpoint's ``meta``.
        seed_before (int): ``runner.seed`` before the resume (the seed the
            sampler was built with).
    """
    loop = runner.train_loop
    if not is_resumable(loop):
        print_log(
            f'ExtRunner: {type(loop).__name__} is not a resumable loop, so '
            'the resumed run continues as MMEngine resumes it (an '
            'EpochBasedTrainLoop trains the first part of the epoch '
            'again); exact resume covers EpochBasedTrainLoop and '
            'IterBasedTrainLoop.',
            logger='current',
            level=logging.WARNING)
        return
    _follow_resumed_seed(loop.dataloader, seed_before, runner.seed)
    recorded = meta.get(META_KEY) or {}
    position = recorded.get('batches_in_epoch')
    if position is None:
        position = _position_without_record(loop, meta)
    else:
        position, changed = same_samples_position(position, recorded,
                                                  runner.world_size,
                                                  _batch_size(loop))
        if changed:
            log_on_every_rank(
                f'ExtRunner (rank {runner.rank}): resumed on another '
                f'number of ranks or batch size: {changed}.', logging.WARNING)
    loop.resume_at(position)
    print_log(
        f'ExtRunner: exact resume at epoch {meta["epoch"]}, iteration '
        f'{meta["iter"]}: {position} batch(es) of this pass skipped by '
        'index, samples seeded by (seed, batch, index), steps by (seed, '
        f'iteration, rank); seed {runner.seed}.',
        logger='current')


def _follow_resumed_seed(dataloader, seed_before: int, seed: int) -> None:
    """Give the sampler and the sample seeds the resumed run's seed where
    they were built with the run's seed before the resume."""
    fetch = getattr(dataloader.dataset, '__getitems__', None)
    if isinstance(fetch, SeededFetch):
        fetch.seed = seed % 2**63
    sampler = dataloader.batch_sampler.sampler
    if seed != seed_before and getattr(sampler, 'seed', None) == seed_before:
        sampler.seed = seed


def _position_without_record(loop, meta: dict) -> int:
    """The position of a checkpoint written without :data:`META_KEY`
    (stock MMEngine, an older mmddp_ext): an iteration loop's iteration,
    an epoch loop's iterations past the epoch's start at a constant
    epoch length."""
    if isinstance(loop, IterBasedTrainLoop):
        return meta['iter']
    position = meta['iter'] - meta['epoch'] * len(loop.dataloader)
    return position if 0 <= position <= len(loop.dataloader) else 0
