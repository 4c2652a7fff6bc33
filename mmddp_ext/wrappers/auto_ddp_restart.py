"""Keep AutoDDP's need for ``find_unused_parameters=True`` for a restart.

When parameters go unused after the probe step, every rank stops with
:class:`~mmddp_ext.wrappers.auto_ddp.UnexpectedUnusedParameterError`. A
run restarted by torchrun (``MAX_RESTARTS=N tools/dist_train.sh``) resumes
from the latest checkpoint, which was written before the need showed; so
rank 0 writes the need into that checkpoint's message hub, where AutoDDP
reads its decision on resume, and the other ranks wait until it is done
(the launcher stops every rank once one exits).
"""
import datetime
import os
import os.path as osp

import torch
import torch.distributed as dist
from mmengine.logging import print_log
from mmengine.runner import find_latest_checkpoint

from ..utils.checkpoint_safety import load_checkpoint_file
from .auto_ddp import DECISION_INFO_KEY, UnexpectedUnusedParameterError

DONE_KEY = 'mmddp_ext/autoddp_need_written/{iteration}'
WAIT_S = 120


def keep_need_for_restart(runner,
                          error: UnexpectedUnusedParameterError) -> None:
    """Write ``error.need`` into the latest checkpoint in
    ``runner.work_dir``; a collective call (every rank raised ``error``).

    Args:
        runner (Runner): The runner whose training stopped.
        error (UnexpectedUnusedParameterError): The error every rank raised.
    """
    if error.need is None:
        return
    distributed = dist.is_available() and dist.is_initialized()
    if not distributed or dist.get_rank() == 0:
        _write_need(runner.work_dir, error.need)
    if not distributed:
        return
    store = dist.distributed_c10d._get_default_store()
    key = DONE_KEY.format(iteration=runner.iter)
    if dist.get_rank() == 0:
        store.set(key, '1')
    else:
        store.wait([key], datetime.timedelta(seconds=WAIT_S))


def _write_need(work_dir: str, need: dict) -> None:
    path = find_latest_checkpoint(work_dir)
    if path is None or not osp.isfile(path):
        print_log(
            'AutoDDP: no checkpoint in the work dir yet, so a restart '
            'cannot learn that this run needs find_unused_parameters=True; '
            "set model_wrapper_cfg=dict(type='AutoDDP', "
            'find_unused_parameters=True).',
            logger='current')
        return
    checkpoint = load_checkpoint_file(path, map_location='cpu')
    hub = checkpoint.setdefault(
        'message_hub', dict(log_scalars={}, runtime_info={}, resumed_keys={}))
    hub['runtime_info'][DECISION_INFO_KEY] = dict(need)
    hub['resumed_keys'][DECISION_INFO_KEY] = True
    partial = f'{path}.autoddp.tmp'
    torch.save(checkpoint, partial)
    os.replace(partial, path)  # a reader never sees half a file
    print_log(
        f'AutoDDP: recorded in {path} that this run needs '
        'find_unused_parameters=True; a run resumed from it (a torchrun '
        'restart resumes by itself) builds DDP that way.',
        logger='current')
