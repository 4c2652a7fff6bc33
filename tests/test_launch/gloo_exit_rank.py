"""One rank of ``test_gloo_exit.py``: a gloo collective that completes
while rank 0 is exiting.

Rank 0 starts an all-reduce, drops its handle and returns. Its first exit
handler (registered after ``init_distributed``, so it runs before
mmddp_ext's) lets rank 1 join, so rank 0's gloo worker thread finishes the
all-reduce, and drops it, while rank 0 exits. A finaliser keeps Python's
finalisation going until rank 1 reports the all-reduce done. Rank 1 leaves
with ``os._exit`` so that only rank 0's exit is under test.
"""
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

from mmddp_ext.launch import process_group as dist_env

EXITING = 'rank0_is_exiting'
DONE = 'rank1_all_reduce_done'


class SlowFinaliser:
    """Keeps interpreter finalisation going until rank 1's all-reduce is
    done (run when the module's globals are cleared; it holds what it
    needs itself, as those globals may be gone by then)."""

    def __init__(self, store):
        self.store, self.done_key = store, DONE

    def __del__(self):
        self.store.wait([self.done_key])


def main() -> None:
    dist_env.init_distributed('pytorch', timeout=60)
    store = dist.distributed_c10d._get_default_store()
    tensor = torch.ones(1)
    if dist.get_rank() == 0:
        atexit.register(store.set, EXITING, '1')
        dist.all_reduce(tensor, async_op=True)
        globals()['finaliser'] = SlowFinaliser(store)
        print('rank 0: exit grace registered: '
              f'{dist_env._exit_grace_registered}', flush=True)
        print('rank 0: leaving with an all-reduce in flight', flush=True)
        return
    store.wait([EXITING])
    dist.all_reduce(tensor)
    store.set(DONE, '1')
    print(f'rank 1: all-reduce done ({tensor.item():.0f})', flush=True)
    sys.stdout.flush()
    time.sleep(0.1)
    os._exit(0)


if __name__ == '__main__':
    main()
