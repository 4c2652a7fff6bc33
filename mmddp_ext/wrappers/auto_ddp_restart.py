"""Keep AutoDDP's need for ``find_unused_parameters=True`` for a restart.

When parameters go unused after the probe step, every rank stops with the
same :class:`~mmddp_ext.wrappers.auto_ddp.UnexpectedUnusedParameterError`
(built from every rank's report, so the ranks agree on it). Rank 0 then
writes the need into the work dir (:data:`NEED_RECORD`), which exists
before the first checkpoint, and the other ranks wait until it is written
(the launcher stops every rank once one exits). A restarted or resumed run
of that work dir reads it (``ExtRunner.load_or_resume``) and AutoDDP
builds DDP with ``find_unused_parameters=True`` before its first step; a
new run in the work dir removes it.
"""
import datetime
from typing import Optional

import torch.distributed as dist
from mmengine.logging import print_log

from ..utils.run_record import (read_record, record_path, remove_record,
                                write_record)
from ..utils.torch_private import default_store
from .auto_ddp import UnexpectedUnusedParameterError

NEED_RECORD = 'autoddp_need.json'
DONE_KEY = 'mmddp_ext/autoddp_need_written/{iteration}'
WAIT_S = 120


def keep_need_for_restart(runner,
                          error: UnexpectedUnusedParameterError) -> None:
    """Write ``error.need`` into ``runner.work_dir``; a collective call
    (every rank raised ``error``).

    Args:
        runner (Runner): The runner whose training stopped.
        error (UnexpectedUnusedParameterError): The error every rank raised.
    """
    if error.need is None:
        return
    distributed = dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:
        path = write_record(runner.work_dir, NEED_RECORD, dict(error.need))
        print_log(
            f'AutoDDP: recorded in {path} that this run needs '
            'find_unused_parameters=True; a restarted or resumed run of '
            'this work dir (a torchrun restart resumes by itself) builds '
            'DDP that way.',
            logger='current')
    if not distributed:
        return
    store = default_store()
    key = DONE_KEY.format(iteration=runner.iter)
    if dist.get_rank() == 0:
        store.set(key, '1')
    else:
        store.wait([key], datetime.timedelta(seconds=WAIT_S))


def read_need(work_dir: str) -> Optional[dict]:
    """The need recorded in ``work_dir``, with ``recorded_in`` naming the
    file, or None."""
    need = read_record(work_dir, NEED_RECORD)
    if not (isinstance(need, dict) and need.get('find_unused_parameters')):
        return None
    return dict(need, recorded_in=record_path(work_dir, NEED_RECORD))


def forget_need(work_dir: str) -> None:
    """Remove the need of an earlier run (a new run starts in the dir)."""
    remove_record(work_dir, NEED_RECORD)
