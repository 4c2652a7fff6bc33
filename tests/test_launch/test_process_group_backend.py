"""The ranks agree on the backend from the cards they use (issue 43's
clusters): NCCL when every rank has a GPU of its own, which a rank cannot
tell from what it sees alone."""
import datetime
import os

import pytest
import torch.distributed as dist

from mmddp_ext.launch import process_group as dist_env
from mmddp_ext.testing import run_on_ranks

# What each of 2 ranks says of its card (launch.process_group.gpu_identity)
# and the backend both must choose.
SCENARIOS = {
    # Each task is shown one of its node's two GPUs, as cuda:0 (srun
    # --gpus-per-task=1, or CUDA_VISIBLE_DEVICES=$SLURM_LOCALID).
    'a card per task':
    (['node1/GPU-a',
      'node1/GPU-b'], ('nccl', 'each of the 2 ranks has a GPU of its own')),
    # The same view from each rank (one GPU, two local ranks), one card.
    'two tasks on one card':
    (['node1/GPU-a', 'node1/GPU-a'], ('gloo', '2 of 2 ranks share a GPU with '
                                      'another rank')),
    # Two nodes, each task on its node's cuda:0 (no uuid: the index).
    'two nodes': (['node1/0', 'node2/0'],
                  ('nccl', 'each of the 2 ranks has a GPU of its own')),
    'a rank without a GPU': (['node1/GPU-a',
                              ''], ('gloo', '1 of 2 ranks have no GPU')),
    'no GPU anywhere': (['', ''], ('gloo', 'CUDA is not available')),
}
EXPECTED = {name: outcome for name, (_, outcome) in SCENARIOS.items()}


def _agree(shared_store: bool):
    rank, world_size = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
    if shared_store:
        store, _, _ = next(
            dist.rendezvous(
                'env://',
                rank,
                world_size,
                timeout=datetime.timedelta(seconds=60)))
    chosen = {}
    for i, (name, (identities, _)) in enumerate(SCENARIOS.items()):
        if shared_store:
            counts = dist_env.count_gpus_shared(store, world_size,
                                                identities[rank], f'test/{i}')
        else:  # the mechanism off: each rank counts what it sees alone
            counts = dist_env.count_gpus_shared(dist.HashStore(), 1,
                                                identities[rank], f'test/{i}')
        chosen[name] = dist_env.decide_backend(None, world_size, *counts)
    return chosen


def test_ranks_agree_on_the_backend_from_their_cards():
    assert run_on_ranks(
        _agree, 2, args=(True, ), timeout=60,
        init_group=False) == [EXPECTED] * 2


def test_what_one_rank_sees_alone_picks_nccl_for_a_shared_card():
    """Negative control: ranks counting alone never see a shared card, and
    pick NCCL for two tasks on one GPU (NCCL then refuses: "Duplicate GPU
    detected"); what they see alone is the same as with a card per task,
    so no rule from it can choose right in both."""
    results = run_on_ranks(
        _agree, 2, args=(False, ), timeout=60, init_group=False)
    for chosen in results:
        assert chosen['two tasks on one card'][0] == 'nccl'
        assert chosen['a card per task'] == EXPECTED['a card per task']


@pytest.mark.parametrize('requested, without_gpu, sharing, expected', [
    (None, 2, 0, ('gloo', 'CUDA is not available')),
    ('nccl', 1, 0, ('gloo', '1 of 2 ranks have no GPU')),
    ('nccl', 0, 2, ('gloo', '2 of 2 ranks share a GPU with another rank')),
    (None, 0, 0, ('nccl', 'each of the 2 ranks has a GPU of its own')),
    ('gloo', 0, 0, ('gloo', "backend 'gloo' requested in dist_cfg")),
])
def test_decide_backend(requested, without_gpu, sharing, expected):
    assert dist_env.decide_backend(requested, 2, without_gpu,
                                   sharing) == expected
