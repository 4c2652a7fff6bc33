"""The fingerprint of a train iteration and the message that explains how
the fingerprints of the ranks differ (used by RankConsistencyHook)."""
import zlib
from collections import Counter
from typing import Any, Dict, List, Sequence, Tuple

from ..datasets.empty_gt_guard_collate import num_gt_instances
from ..utils.text import ranks_text, shorten
from ..utils.torch_private import collective_sequence_number

# The fingerprint of a checked iteration, in the order of its tensor. The
# ranks must agree on every field but ``gt_boxes``, which only explains a
# difference (ranks see different data).
COMPARED_FIELDS = ('iteration', 'loss_keys_hash', 'num_loss_keys',
                   'forward_collectives', 'trainable_params')
FINGERPRINT_FIELDS = COMPARED_FIELDS + ('gt_boxes', )
UNKNOWN = -1
MAX_LISTED_KEYS = 8
EMPTY_GT_FIX = (
    "use the DDP-safe heads (model.type='DDPSafeDINO', "
    "model.bbox_head.type='DDPSafeDINOHead') or "
    "train_dataloader.collate_fn=dict(type='empty_gt_guard_collate', "
    "policy='swap')")


class RankDivergenceError(RuntimeError):
    """The ranks ran different code in one iteration; raised on every rank
    with the same message."""


def loss_keys_hash(keys: Sequence[str]) -> int:
    """A hash of the sorted loss keys that is the same in every process
    (``hash()`` of a str is salted per process)."""
    return zlib.crc32('\n'.join(sorted(keys)).encode())


def keys_text(keys: Sequence[str]) -> str:
    return shorten(sorted(keys), MAX_LISTED_KEYS)


def _per_rank(values: Sequence[Any]) -> str:
    return ', '.join(f'rank {r}: {v}' for r, v in enumerate(values))


def _gt_text(gt_boxes: int) -> str:
    return 'unknown' if gt_boxes == UNKNOWN else str(gt_boxes)


def _gt_list(details: List[dict], ranks: Sequence[int], limit: int = 4) -> str:
    shown = ', '.join(f'rank {r}: {_gt_text(details[r]["gt_boxes"])}'
                      for r in ranks[:limit])
    return shown + (', ...' if len(ranks) > limit else '')


def _describe_loss_keys(details: List[dict]) -> List[str]:
    """One line per group of ranks whose loss keys differ from the most
    common key set (the lowest rank's set on a tie)."""
    key_sets = [tuple(d['loss_keys']) for d in details]
    counts = Counter(key_sets)
    reference = max(key_sets, key=lambda s: (counts[s], -key_sets.index(s)))
    ref_ranks = [r for r, s in enumerate(key_sets) if s == reference]
    groups: Dict[Tuple, List[int]] = {}
    for rank, keys in enumerate(key_sets):
        if keys != reference:
            extra = tuple(sorted(set(keys) - set(reference)))
            missing = tuple(sorted(set(reference) - set(keys)))
            groups.setdefault((extra, missing), []).append(rank)
    lines = []
    for (extra, missing), ranks in groups.items():
        one = len(ranks) == 1
        parts = []
        if missing:
            parts.append(f'{"is" if one else "are"} missing loss key(s) '
                         f'{keys_text(missing)}')
        if extra:
            parts.append(f'{"has" if one else "have"} extra loss key(s) '
                         f'{keys_text(extra)}')
        gts = [details[r]['gt_boxes'] for r in ranks]
        line = (f'{ranks_text(ranks)} {" and ".join(parts)}, compared with '
                f'{ranks_text(ref_ranks)}; GT boxes in the batch: '
                f'{_gt_list(details, ranks)} '
                f'({_gt_list(details, ref_ranks)})')
        if missing and all(g == 0 for g in gts):
            line += f'. With 0 GT boxes, {EMPTY_GT_FIX}'
        else:
            line += ('. A loss computed on some ranks only leaves '
                     'parameters and collectives unmatched across ranks: '
                     'compute it on every rank, with zero weight where it '
                     'does not apply')
        lines.append(line)
    return lines


def describe_divergence(details: List[dict]) -> str:
    """The error message for fingerprints that differ across ranks.

    Args:
        details (list[dict]): Per rank, in rank order: the fingerprint
            fields (see ``FINGERPRINT_FIELDS``) with ``loss_keys`` (the
            sorted loss keys) in place of their hash and count.

    Returns:
        str: One message naming the ranks and each difference.
    """
    iteration = details[0]['iteration']
    lines = []
    iterations = [d['iteration'] for d in details]
    if len(set(iterations)) > 1:
        lines.append(
            f'the ranks are at different iterations ({_per_rank(iterations)})'
            ': a rank skipped or repeated an iteration (different dataloader '
            'lengths, or a checkpoint resumed on some ranks only)')
        iteration = max(iterations)
    if len({tuple(d['loss_keys']) for d in details}) > 1:
        lines.extend(_describe_loss_keys(details))
    collectives = [d['forward_collectives'] for d in details]
    if UNKNOWN not in collectives and len(set(collectives)) > 1:
        lines.append(
            'the forward issued different numbers of collective calls '
            f'(all_reduce, broadcast, ...) in this iteration '
            f'({_per_rank(collectives)}): a collective inside a branch that '
            "only some ranks take (such as a loss's reduce_mean of its "
            'avg_factor) pairs with an unrelated call on the other ranks')
    trainable = [d['trainable_params'] for d in details]
    if len(set(trainable)) > 1:
        lines.append(
            'the number of parameters with requires_grad=True differs '
            f'({_per_rank(trainable)}): freeze or unfreeze parameters on '
            'every rank alike')
    if not lines:  # only fields torch could not read on some ranks
        lines.append('the fingerprints differ: ' +
                     '; '.join(f'rank {r}: {d}'
                               for r, d in enumerate(details)))
    return (f'RankConsistencyHook: the ranks diverged in iteration '
            f'{iteration}, before its backward; stopping every rank now '
            '(DDP would hang, or fail later with an unrelated error):\n- ' +
            '\n- '.join(lines))


def collective_count(group) -> int:
    """How many collectives this rank has issued on ``group``."""
    try:
        return collective_sequence_number(group)
    except (AttributeError, RuntimeError):
        return UNKNOWN


def gt_boxes_in(data_batch: Any) -> int:
    samples = (
        data_batch.get('data_samples')
        if isinstance(data_batch, dict) else None)
    if not isinstance(samples, (list, tuple)):
        return UNKNOWN
    counts = [num_gt_instances(s) for s in samples]
    return UNKNOWN if None in counts else sum(counts)
