"""How messages name ranks, lists and parameters, in one place, and how
a message reaches the console of every rank."""
import logging
import sys
from collections import OrderedDict
from typing import Dict, List, Sequence

from mmengine.dist import get_rank
from mmengine.logging import print_log

MAX_LISTED = 8
MAX_LOGGED_GROUPS = 8


def ranks_text(ranks: Sequence[int]) -> str:
    """``'rank 1'`` or ``'ranks 0, 1'``."""
    ranks = list(ranks)
    if len(ranks) == 1:
        return f'rank {ranks[0]}'
    return 'ranks ' + ', '.join(str(r) for r in ranks)


def more_text(count: int, noun: str = '') -> str:
    """``'(+3 more)'``, or ``'(+3 more modules)'`` with ``noun``."""
    return f'(+{count} more{" " + noun if noun else ""})'


def shorten(items: Sequence[str], limit: int = MAX_LISTED) -> str:
    """``'a, b, c (+4 more)'``: the first ``limit`` items, joined, and how
    many were left out."""
    items = list(items)
    shown = ', '.join(items[:limit])
    left_out = len(items) - limit
    return shown + (f' {more_text(left_out)}' if left_out > 0 else '')


def group_param_names(names: Sequence[str],
                      max_groups: int = MAX_LOGGED_GROUPS) -> str:
    """``'head.{a,b}, neck.w, (+3 more modules)'``: names grouped by their
    owning module, truncated to ``max_groups`` modules."""
    groups: Dict[str, List[str]] = OrderedDict()
    for name in names:
        prefix, _, leaf = name.rpartition('.')
        groups.setdefault(prefix, []).append(leaf)
    parts = []
    for prefix, leaves in list(groups.items())[:max_groups]:
        leaf = leaves[0] if len(leaves) == 1 else '{' + ','.join(leaves) + '}'
        parts.append(f'{prefix}.{leaf}' if prefix else leaf)
    if len(groups) > max_groups:
        parts.append(more_text(len(groups) - max_groups, 'modules'))
    return ', '.join(parts)


def log_on_every_rank(message: str, level: int = logging.INFO) -> None:
    """Log ``message`` on every rank: MMEngine's logger shows the other
    ranks' records below ERROR nowhere on the console (and writes their
    log files only with ``log_level='DEBUG'``), so they print it as
    well."""
    print_log(message, logger='current', level=level)
    if get_rank() != 0:
        print_log(message, logger=None)
        sys.stdout.flush()
