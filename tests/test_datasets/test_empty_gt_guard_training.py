"""The guard and its stats hook in real 2-rank training of stock mmdet DINO.

One run covers the acceptance criteria together (each Runner start costs
tens of seconds on 2 shared cores): 2 gloo ranks, 2 persistent DataLoader
workers per rank, an unshuffled ~50 %-empty dataset laid out so that
batches are all-empty on one rank while the other has boxes, stock DINO
(no head patch) and ``policy='swap'``: ``tools/train.py`` as
``tools/dist_train.sh`` starts it, on ranks forked with their imports done
(``tests/helpers.py::train_on_ranks``; the guard is the subject, not the
launcher).
"""
import json
import os.path as osp
import re

from mmddp_ext.testing import make_synthetic_coco
from ..helpers import (TINY_CONFIG, data_options, rank0_log, tiny_options,
                       train_on_ranks)

ITERS = 5
# 16 images, DefaultSampler without shuffle on 2 ranks, batch 2: rank r,
# batch k holds images r + 4k and r + 4k + 2, and DataLoader worker k % 2
# collates it. Epoch 2 starts at iteration 4 (batch 0 again).
#   rank 0: [0 box, 2 -] [4 box, 6 box] [8 -, 10 -] [12 box, 14 -]
#   rank 1: [1 -, 3 -]   [5 box, 7 box] [9 -, 11 box] [13 -, 15 -]
EMPTY_IMAGE_IDS = {1, 2, 3, 8, 9, 10, 13, 14, 15}
# What the guard does, by iteration: rank 1's first batch falls back
# (worker 0 has seen no box yet); in epoch 2 the same batch is swapped
# because the persistent worker kept its reservoir.
EXPECTED_ACTIONS = {
    0: {
        2: 'swapped'
    },
    1: {
        0: 'fallback',
        3: 'swapped',
        4: 'swapped'
    },
}
# Cumulative counters in the log line of each iteration.
EXPECTED_LOGGED = {
    'rank0_empty_samples': [1, 1, 3, 4, 5],
    'rank0_all_empty_batches': [0, 0, 1, 1, 1],
    'rank0_swaps': [0, 0, 1, 1, 1],
    'rank0_fallbacks': [0, 0, 0, 0, 0],
    'rank1_empty_samples': [2, 2, 3, 5, 7],
    'rank1_all_empty_batches': [1, 1, 1, 2, 3],
    'rank1_swaps': [0, 0, 0, 1, 2],
    'rank1_fallbacks': [1, 1, 1, 1, 1],
}


def _make_dataset(root: str) -> None:
    train = osp.join(root, 'train')
    make_synthetic_coco(train, num_images=16, empty='none')
    # The GT pattern is what matters here: drop the chosen images' boxes.
    ann_file = osp.join(train, 'annotations.json')
    with open(ann_file) as f:
        coco = json.load(f)
    coco['annotations'] = [
        a for a in coco['annotations'] if a['image_id'] not in EMPTY_IMAGE_IDS
    ]
    with open(ann_file, 'w') as f:
        json.dump(coco, f)
    make_synthetic_coco(osp.join(root, 'val'), num_images=2, seed=1)


GUARD_CONFIG = """\
_base_ = [{base!r}]
custom_imports = dict(
    imports=['mmddp_ext', 'tests.test_datasets.batch_recorder'],
    allow_failed_imports=False)
train_dataloader = dict(
    num_workers=2,
    persistent_workers=True,
    sampler=dict(shuffle=False),
    collate_fn=dict(type='empty_gt_guard_collate', policy='swap'))
custom_hooks = [
    dict(type='EmptyGTStatsHook'),
    dict(type='GuardBatchRecorder'),
]
"""


def _logged_counters(log: str):
    lines = [line for line in log.splitlines() if 'Iter(train)' in line]
    values = {}
    for line in lines:
        for name, value in re.findall(r'empty_gt/(\w+): ([\d.]+)', line):
            values.setdefault(name, []).append(float(value))
    return lines, values


def test_swap_on_two_ranks_with_persistent_workers(tmp_path):
    data_root = str(tmp_path / 'data')
    _make_dataset(data_root)
    work_dir = str(tmp_path / 'work')
    config = tmp_path / 'guard_swap.py'
    config.write_text(GUARD_CONFIG.format(base=TINY_CONFIG))
    run = train_on_ranks(
        str(config),
        2,
        work_dir,
        data_options(data_root) + tiny_options(ITERS),
        timeout=240)
    assert run.returncode == 0, run.stdout[-4000:]
    per_rank = []
    for rank in range(2):
        with open(osp.join(work_dir, f'batches_rank{rank}.json')) as f:
            per_rank.append(json.load(f))

    # Same number of batches on every rank, none smaller than configured.
    assert [len(batches) for batches in per_rank] == [ITERS, ITERS]
    for rank, batches in enumerate(per_rank):
        assert all(b['images'] == len(b['gt']) == 2 for b in batches)
        actions = {
            i: b['action']
            for i, b in enumerate(batches) if b['action']
        }
        assert actions == EXPECTED_ACTIONS[rank]
        # Once a worker's reservoir is warm no batch reaches DINO without
        # a box; the one that did (rank 1, iteration 0, while rank 0's
        # batch had boxes) is trained on by stock DINO without a hang.
        all_empty = [i for i, b in enumerate(batches) if not any(b['gt'])]
        assert all_empty == ([0] if rank == 1 else [])

    log = rank0_log(work_dir)
    lines, logged = _logged_counters(log)
    assert len(lines) == ITERS
    for name, values in EXPECTED_LOGGED.items():
        assert logged[name] == values, name
    assert logged['empty_ratio'][-1] == 12 / 20
    assert ('rank 1: 7/10 samples without GT, 3 all-empty batches, 2 '
            'swaps, 1 fallbacks') in log
