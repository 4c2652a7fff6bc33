"""RankStatusHook publishes each rank's iteration and phase in the process
group's store, where ``read_rank_status`` (used by ExtRunner when a
collective times out) finds them, on real gloo ranks."""
from types import SimpleNamespace

import torch.distributed as dist

from mmddp_ext.hooks.rank_status_hook import read_rank_status
from mmddp_ext.testing import run_on_ranks


def _report_and_read():
    from mmengine.registry import HOOKS
    before = read_rank_status(2)  # the control: nothing published yet
    dist.barrier()
    hook = HOOKS.build(dict(type='RankStatusHook'))
    runner = SimpleNamespace(iter=4)
    if dist.get_rank() == 0:
        hook.before_train_iter(runner, batch_idx=4)
    else:
        hook.after_train_iter(runner, batch_idx=4)
    dist.barrier()
    return before, read_rank_status(2)


def test_every_rank_reads_every_ranks_last_phase():
    results = run_on_ranks(_report_and_read, 2, timeout=60)
    for before, after in results:
        assert before == {0: 'no status reported', 1: 'no status reported'}
        assert after[0].startswith(
            'iter 5, train step (forward/backward/step), ')
        assert after[1].startswith('iter 5, after train step (hooks), ')
        assert after[0].endswith('s ago') and after[1].endswith('s ago')
