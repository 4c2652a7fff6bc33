"""One rank of ``test_gloo_exit.py``: a gloo collective that completes
while rank 0 is exiting.

Rank 0 starts an all-reduce, drops its handle and returns. Its first exit
handler (registered after ``init_distributed``, so it runs before
mmddp_ext's) lets rank 1 join and keeps the GIL meanwhile: rank 0's gloo
worker thread finishes the all-reduce and waits for the GIL to drop it, as
when a script ends right after a collective. It gets the GIL either in
mmddp_ext's exit grace (the interpreter is whole) or, with the grace off,
once Python finalises: a finaliser keeps finalisation going, with the GIL
released, until rank 1 reports the all-reduce done and a little longer.
Rank 1 leaves with ``os._exit`` so that only rank 0's exit is under test.
"""
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

from mmddp_ext.utils.dist_env import init_distributed

EXITING = 'rank0_is_exiting'
DONE = 'rank1_all_reduce_done'
# Rank 0's first exit handler keeps the GIL this long after telling rank
# 1, so that its worker thread finishes the all-reduce meanwhile and waits
# for the GIL to drop it.
HOLD_GIL_S = 1.5
# How long finalisation goes on after rank 1's all-reduce: time for rank
# 0's worker thread to drop the collective.
AFTER_DONE_S = 2.0


class SlowFinaliser:
    """Keeps interpreter finalisation going, with the GIL released, until
    rank 1's all-reduce is done and ``AFTER_DONE_S`` more (run when the
    module's globals are cleared; it holds what it needs itself)."""

    def __init__(self, store):
        # Module globals may be gone by the time __del__ runs.
        self.store, self.done_key, self.after_s = store, DONE, AFTER_DONE_S
        self.sleep = time.sleep

    def __del__(self):
        self.store.wait([self.done_key])
        self.sleep(self.after_s)


def tell_rank1_and_hold_the_gil(store) -> None:
    """Exit handler: let rank 1 join, then keep the GIL for HOLD_GIL_S
    (a loop without system calls, and no switch requests honoured)."""
    store.set(EXITING, '1')
    sys.setswitchinterval(1e6)
    end = time.monotonic() + HOLD_GIL_S
    while time.monotonic() < end:
        pass


def main() -> None:
    init_distributed('pytorch', timeout=60)
    store = dist.distributed_c10d._get_default_store()
    tensor = torch.ones(1)
    if dist.get_rank() == 0:
        atexit.register(tell_rank1_and_hold_the_gil, store)
        dist.all_reduce(tensor, async_op=True)
        globals()['finaliser'] = SlowFinaliser(store)
        print('rank 0: leaving with an all-reduce in flight', flush=True)
        return
    store.wait([EXITING])
    dist.all_reduce(tensor)
    store.set(DONE, '1')
    print(f'rank 1: all-reduce done ({tensor.item():.0f})', flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == '__main__':
    main()
