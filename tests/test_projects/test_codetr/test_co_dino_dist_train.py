"""``tools/dist_train.sh configs/co_dino_tiny.py N`` on 2 and 3 gloo ranks:
one rank only ever sees GT-less images, the query head is extended with
a parameter that never reaches the loss, and the encoder checkpoints its
activations. Nothing about DDP is set by hand: AutoDDP and the
CheckpointConflictHook of the mmddp_ext stack handle it. The 2-rank run is
a launch of ``tools/dist_train.sh``; the 3-rank one runs ``tools/train.py``
as that script starts it, on ranks forked with their imports done
(``tests/helpers.py::train_on_ranks``: the world size is its subject)."""
import json
import os.path as osp

import pytest

from mmddp_ext.testing import make_synthetic_coco
from ...helpers import (as_cli, data_overrides, dist_train, logged_iters,
                        tiny_overrides, train_on_ranks)
from .codetr_utils import TINY_CONFIG

ITERS = 3
# With an unshuffled sampler rank r reads images r, r + W, ...: these make
# every image of rank 1 GT-less.
EMPTY_IMAGES = {2: 'odd', 3: 'mod3:1'}
EMPTY_RANK = 1
# Custom imports are read when the config file is loaded, so the extension
# goes into a leaf config, as a user would write it.
EXTENDED_CONFIG = f"""
_base_ = ['{TINY_CONFIG}']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.CO-DETR.codetr',
             'tests.test_projects.test_codetr.extended_heads'],
    allow_failed_imports=False)
model = dict(
    query_head=dict(
        type='CoDINOHeadWithUnusedParam',
        transformer=dict(encoder=dict(with_cp=1))))
custom_hooks = [dict(type='LossKeyRecorderHook')]
"""


@pytest.mark.parametrize('nproc', [2, 3])
def test_extended_head_with_encoder_checkpointing_trains(tmp_path, nproc):
    root = str(tmp_path / 'data')
    make_synthetic_coco(
        osp.join(root, 'train'),
        num_images=nproc * 2 * ITERS,
        empty=EMPTY_IMAGES[nproc])
    make_synthetic_coco(osp.join(root, 'val'), num_images=2, seed=1)
    work_dir = str(tmp_path / 'work')
    overrides = dict(data_overrides(root), **tiny_overrides(ITERS))
    overrides.update({
        'train_dataloader.sampler.shuffle': False,
    })
    config = tmp_path / 'co_dino_tiny_extended.py'
    config.write_text(EXTENDED_CONFIG)
    launch = dist_train if nproc == 2 else train_on_ranks
    result = launch(
        str(config), nproc, work_dir, as_cli(overrides), timeout=150)
    out = result.stdout
    assert result.returncode == 0, out[-4000:]
    # The launch itself (tests/test_tools runs tiny DINO on 2 ranks only).
    assert f'gloo process group, rank 0/{nproc}' in out
    assert logged_iters(out) == list(range(1, ITERS + 1))
    assert 'AutoDDP:' in out and 'query_head.unused_scale' in out
    assert 'CheckpointConflictHook: checked 1 checkpointing module' in out \
        or 'non-reentrant in 1 module(s): query_head.transformer.encoder' \
        in out, out[-3000:]

    histories = []
    for rank in range(nproc):
        with open(osp.join(work_dir, f'loss_keys_rank{rank}.json')) as f:
            histories.append(json.load(f))
    for rank, history in enumerate(histories):
        assert len(history) == ITERS, rank
        for step in history:
            assert step['finite'], (rank, step)
            assert step['keys'] == histories[0][0]['keys'], rank
        seen_gt = sum(step['num_gt'] for step in history)
        assert (seen_gt == 0) == (rank == EMPTY_RANK), (rank, seen_gt)
    assert {'dn_loss_cls', 'loss_cls_aux0', 'loss_cls_aux1',
            'loss_rpn_cls'} <= set(histories[0][0]['keys'])
