"""``empty_gt_guard_collate``: ``pseudo_collate`` that knows when a training
batch has no ground truth, and can make sure it has some.

DETR-family denoising builds its query groups from the batch's GT. On
datasets that are 30-50 % background images, a rank can draw a batch in
which no image has a box; with a head that is not DDP-safe that rank then
builds a different graph (or different loss keys) from its peers and DDP
hangs. ``filter_empty_gt=True`` avoids it by throwing the images away. This
collate function keeps them and handles the all-empty batch by ``policy``.

Use it for the training dataloader only::

    train_dataloader = dict(
        collate_fn=dict(type='empty_gt_guard_collate', policy='swap'))

State between batches (the reservoir of recent non-empty samples) lives in
the process that collates: each DataLoader worker, or the main process when
``num_workers=0``. It is reset when the process id changes, so forked
workers never inherit the parent's samples, and it survives between epochs
when ``persistent_workers=True``. Everything passed to the DataLoader is a
module-level function with plain keyword arguments, so it pickles for the
``spawn`` and ``fork`` start methods alike.
"""
import copy
import logging
import os
import random
from collections import deque
from typing import Any, Deque, Dict, List, Optional, Sequence

import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import print_log
from mmengine.registry import FUNCTIONS
from mmengine.structures import BaseDataElement

GUARD_POLICIES = ('keep', 'swap', 'error')
DEFAULT_POLICY = 'keep'
DEFAULT_RESERVOIR_SIZE = 4
# Metainfo key of the mark on the data samples of an all-empty batch.
GUARD_MARK_KEY = 'empty_gt_guard'

# Columns that pseudo_collate returns as the plain list of values.
_LIST_COLUMN_TYPES = (torch.Tensor, BaseDataElement)


class AllEmptyGTBatchError(RuntimeError):
    """A training batch had no GT instances and ``policy='error'``."""


class _CollateProcessState:
    """What one collating process remembers between batches."""

    def __init__(self, reservoir_size: int) -> None:
        self.pid = os.getpid()
        self.reservoir: Deque[Dict] = deque(maxlen=reservoir_size)
        # DataLoader seeds torch per worker (and MMEngine per rank), so the
        # choice of the swapped-in sample is reproducible.
        self.rng = random.Random(torch.initial_seed())
        self.warned_fallback = False


_process_state: Optional[_CollateProcessState] = None


def _state_for_this_process(reservoir_size: int) -> _CollateProcessState:
    global _process_state
    state = _process_state
    if state is None or state.pid != os.getpid():
        state = _process_state = _CollateProcessState(reservoir_size)
    elif state.reservoir.maxlen != reservoir_size:
        state.reservoir = deque(state.reservoir, maxlen=reservoir_size)
    return state


def reset_empty_gt_guard() -> None:
    """Forget this process's reservoir and warnings (a new dataset)."""
    global _process_state
    _process_state = None


def check_guard_args(policy: str = DEFAULT_POLICY,
                     reservoir_size: int = DEFAULT_RESERVOIR_SIZE,
                     **unknown) -> None:
    """Raise ``ValueError`` for a bad ``collate_fn`` config of the guard.

    Args:
        policy (str): See :func:`empty_gt_guard_collate`.
            Defaults to 'keep'.
        reservoir_size (int): See :func:`empty_gt_guard_collate`.
            Defaults to 4.
        **unknown: Any other key; its presence is an error (a typo such as
            ``polcy`` would otherwise be ignored or fail inside a worker).
    """
    where = "train_dataloader.collate_fn (type='empty_gt_guard_collate')"
    if unknown:
        raise ValueError(
            f'{where} got unknown key(s) {sorted(unknown)}; the accepted '
            "keys are 'policy' and 'reservoir_size'. Remove or rename them.")
    if not isinstance(policy, str) or policy not in GUARD_POLICIES:
        raise ValueError(
            f'{where}: policy must be one of {GUARD_POLICIES}, but got '
            f'{policy!r}. Use {DEFAULT_POLICY!r} to pass all-empty batches '
            "through (DDP-safe heads), 'swap' to give each one a recently "
            "seen annotated sample, or 'error' to stop on the first one.")
    if (isinstance(reservoir_size, bool)
            or not isinstance(reservoir_size, int) or reservoir_size < 1):
        raise ValueError(
            f'{where}: reservoir_size must be an int >= 1 (how many recent '
            'annotated samples each worker keeps for policy=\'swap\'), but '
            f'got {reservoir_size!r} ({type(reservoir_size).__name__}). '
            f'Use e.g. reservoir_size={DEFAULT_RESERVOIR_SIZE}.')


def num_gt_instances(data_sample: Any) -> Optional[int]:
    """Number of GT instances of a packed data sample.

    Args:
        data_sample (Any): Usually a ``DetDataSample`` from
            ``PackDetInputs``.

    Returns:
        int | None: The count, or ``None`` when the sample carries no GT
        annotations at all: no ``gt_instances``, or one without fields,
        which is what ``PackDetInputs`` packs when no annotations were
        loaded (test-time pipelines).
    """
    gt_instances = getattr(data_sample, 'gt_instances', None)
    if gt_instances is None:
        return None
    labels = getattr(gt_instances, 'labels', None)
    # len(InstanceData) builds a list of every field; the labels tensor
    # holds the same count and is read in a fraction of the time.
    if labels is not None:
        return labels.shape[0]
    if not gt_instances.keys():
        return None
    return len(gt_instances)


def _gt_counts(data_batch: Sequence) -> Optional[List[int]]:
    """GT count per item, or None if some item carries no GT at all."""
    counts = []
    for item in data_batch:
        try:
            data_sample = item['data_samples']
        except (TypeError, KeyError, IndexError):
            raise TypeError(
                "empty_gt_guard_collate expects the items that MMDetection's "
                "PackDetInputs produces (dicts with 'inputs' and "
                f"'data_samples'), but got a {type(item).__name__}. End the "
                "train pipeline with PackDetInputs, or use collate_fn=dict("
                "type='pseudo_collate') for this dataset.") from None
        count = num_gt_instances(data_sample)
        if count is None:
            return None
        counts.append(count)
    return counts


def _collate(data_batch: Sequence) -> Any:
    """``pseudo_collate(data_batch)``, with one pass for packed dicts.

    For a batch of plain dicts, each key becomes the list of the items'
    values, and pseudo_collate is called only for a column it would change
    (one whose first value is not a tensor or data element). That is what
    pseudo_collate returns for such a batch, without its per-column type
    dispatch, which is most of its cost on ``PackDetInputs`` output.
    """
    first = data_batch[0] if data_batch else None
    if type(first) is not dict:
        return pseudo_collate(data_batch)
    batch = {}
    for key, value in first.items():
        column = [item[key] for item in data_batch]
        batch[key] = (
            column if isinstance(value, _LIST_COLUMN_TYPES) else
            pseudo_collate(column))
    return batch


def _warn_fallback_once(state: _CollateProcessState, batch_size: int) -> None:
    if state.warned_fallback:
        return
    state.warned_fallback = True
    print_log(
        f"empty_gt_guard_collate(policy='swap'): none of the {batch_size} "
        'samples of a training batch has a GT box, and this data process '
        f'(pid {state.pid}) has not seen an annotated sample to swap in '
        'yet, so the batch is passed through unchanged. This is expected '
        'for the first batches of each worker; if EmptyGTStatsHook keeps '
        "counting 'fallbacks' for a rank, that rank's data has no boxes "
        'and only a DDP-safe head keeps it in step. Warned once per '
        'process.',
        logger='current',
        level=logging.WARNING)


def _all_empty_error(data_batch: Sequence) -> AllEmptyGTBatchError:
    paths = [
        str(getattr(item['data_samples'], 'img_path', '?'))
        for item in data_batch
    ]
    return AllEmptyGTBatchError(
        f"empty_gt_guard_collate(policy='error'): none of the "
        f'{len(data_batch)} samples of this training batch has a GT box '
        f'({", ".join(paths)}). With a head that is not DDP-safe such a '
        "batch can hang DDP. Set policy='swap' to replace one sample with "
        "a recent annotated one, policy='keep' with a DDP-safe head, or a "
        'larger batch size; filter_empty_gt=True drops the images instead.')


def _copy_item(item: Dict) -> Dict:
    """A deep copy of a packed item, so that marking it (and anything done
    to it later in this process) leaves the reservoir and earlier batches
    alone. ``Tensor.clone`` is ~8x faster than deepcopy on the image."""
    copied = {}
    for key, value in item.items():
        is_tensor = isinstance(value, torch.Tensor)
        copied[key] = value.clone() if is_tensor else copy.deepcopy(value)
    return copied


def _guard_all_empty(data_batch: Sequence, policy: str,
                     state: Optional[_CollateProcessState]) -> List:
    """Apply ``policy`` to a batch none of whose samples has a GT box."""
    if policy == 'error':
        raise _all_empty_error(data_batch)
    batch = list(data_batch)
    swapped = fallback = False
    if state is not None and state.reservoir:
        batch[-1] = _copy_item(state.rng.choice(state.reservoir))
        swapped = True
    elif state is not None:
        fallback = True
        _warn_fallback_once(state, len(batch))
    for item in batch:
        item['data_samples'].set_field(
            dict(all_empty=True, swapped=swapped, fallback=fallback),
            GUARD_MARK_KEY,
            field_type='metainfo')
    return batch


@FUNCTIONS.register_module()
def empty_gt_guard_collate(data_batch: Sequence,
                           policy: str = DEFAULT_POLICY,
                           reservoir_size: int = DEFAULT_RESERVOIR_SIZE,
                           **unknown) -> Any:
    """``pseudo_collate`` for training batches that may have no GT boxes.

    The output has exactly the structure ``pseudo_collate`` gives. A batch
    in which at least one sample has a GT instance is returned as
    ``pseudo_collate`` returns it, untouched. A batch in which no sample
    has one ("all-empty") is handled by ``policy``, and its data samples
    get the metainfo field ``empty_gt_guard = dict(all_empty=True,
    swapped=..., fallback=...)``, which :class:`EmptyGTStatsHook` counts.
    Samples without ``gt_instances`` (test-time pipelines) are never
    inspected or marked.

    Policies:

    - ``'keep'`` (default): pass the batch through and mark it. It is the
      default because it is the only policy that trains on exactly what
      the sampler drew: every background image is seen once per epoch,
      the empty-image ratio and the per-rank shards are unchanged. It is
      correct whenever the head handles all-empty batches in DDP, which
      mmddp_ext's DDP-safe heads do by design and mmdet 3.3's DINO does
      too (tests/test_datasets/test_empty_gt_guard_training.py trains it
      on 2 gloo ranks with one rank's batch all-empty). ``'swap'`` could
      not replace that anyway: a worker that has not seen an annotated
      image yet still passes an all-empty batch through.
    - ``'swap'``: replace the last sample with a copy of one of the
      ``reservoir_size`` annotated samples this process collated most
      recently, so the batch carries at least one box. Batch size and the
      number of batches per rank never change, but some annotated images
      are seen twice and that background image is not seen this time. Use
      it with heads that are not DDP-safe. While the reservoir is still
      empty the batch is passed through, marked ``fallback=True``, with a
      warning once per process.
    - ``'error'``: raise :class:`AllEmptyGTBatchError` naming the images.

    Use it only in ``train_dataloader``: validation and test batches must
    not be altered, and :class:`EmptyGTStatsHook` refuses a config that
    sets it for ``val_dataloader`` or ``test_dataloader``.

    Args:
        data_batch (Sequence): Items from the dataset, dicts with
            ``inputs`` and ``data_samples`` as ``PackDetInputs`` makes.
        policy (str): What to do with an all-empty batch: ``'keep'``,
            ``'swap'`` or ``'error'``. Defaults to 'keep'.
        reservoir_size (int): How many recent annotated samples each
            collating process keeps for ``'swap'``. Each one holds its
            image tensor in memory. Defaults to 4.
        **unknown: Refused with a ``ValueError`` naming the keys.

    Returns:
        Any: The collated batch, as ``pseudo_collate`` returns it.

    Raises:
        ValueError: A config key or value is invalid.
        TypeError: The items are not ``PackDetInputs`` dicts.
        AllEmptyGTBatchError: An all-empty batch with ``policy='error'``.
    """
    if (unknown or policy not in GUARD_POLICIES
            or type(reservoir_size) is not int or reservoir_size < 1):
        check_guard_args(policy, reservoir_size, **unknown)
    counts = _gt_counts(data_batch)
    if counts is None or not data_batch:
        return pseudo_collate(data_batch)
    state = None
    if policy == 'swap':
        state = _state_for_this_process(reservoir_size)
        for item, count in zip(data_batch, counts):
            if count:
                state.reservoir.append(item)
    if any(counts):
        return _collate(data_batch)
    return _collate(_guard_all_empty(data_batch, policy, state))
