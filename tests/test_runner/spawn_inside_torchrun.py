"""Run under torchrun or as an srun task: a worker that spawns its own
'rank' process, which then tries to join the process group (two layers of
process management)."""
import multiprocessing as mp
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def child(queue):
    from mmddp_ext.launch.process_group import init_distributed
    try:
        init_distributed('pytorch')
        queue.put('CHILD JOINED')
    except ValueError as error:
        queue.put(f'CHILD REFUSED: {error}')


if __name__ == '__main__':
    ctx = mp.get_context('spawn')
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue, ))
    proc.start()
    print(queue.get(timeout=60), flush=True)
    proc.join()
