"""One rank of ``test_gloo_exit.py``: a gloo collective that completes
while rank 0 is exiting.

Rank 0 starts an all-reduce, drops its handle and returns; an exit
handler registered after ``init_distributed`` (so it runs before
mmddp_ext's) lets rank 1 join the all-reduce. Rank 0's gloo worker thread
then drops the finished collective either during mmddp_ext's exit grace
(the interpreter is whole) or, with the grace off, while Python finalises,
which a slow finaliser keeps going long enough to be sure of it. Rank 1
leaves with ``os._exit`` so that only rank 0's exit is under test.
"""
import atexit
import os
import sys
import time

import torch
import torch.distributed as dist

from mmddp_ext.utils.dist_env import init_distributed

KEY = 'rank0_is_exiting'


class SlowFinaliser:
    """Keeps interpreter finalisation going for a second, with the GIL
    released, when the module's globals are cleared."""

    def __del__(self):
        time.sleep(1.0)


def main() -> None:
    init_distributed('pytorch', timeout=60)
    store = dist.distributed_c10d._get_default_store()
    tensor = torch.ones(1)
    if dist.get_rank() == 0:
        atexit.register(store.set, KEY, '1')
        dist.all_reduce(tensor, async_op=True)
        globals()['finaliser'] = SlowFinaliser()
        print('rank 0: leaving with an all-reduce in flight', flush=True)
        return
    store.wait([KEY])
    dist.all_reduce(tensor)
    print(f'rank 1: all-reduce done ({tensor.item():.0f})', flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == '__main__':
    main()
