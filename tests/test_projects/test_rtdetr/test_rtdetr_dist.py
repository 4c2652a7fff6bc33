"""RT-DETR-tiny on 2 and 3 real gloo ranks, one of which only ever sees
GT-less images, with ``find_unused_parameters=False``.

Each world size spawns once (``dist_run``): every rank runs two plain-DDP
steps on a fixed batch (rank 1's has no GT), then ``configs/rtdetr_tiny.py``
trains (``tools/train.py`` as ``tools/dist_train.sh`` starts it, on ranks
forked with their imports done: ``tests/helpers.py::train_on_ranks``; the
subject is what DDP does with the model, and until 2026-11-29 the 2-rank
run was a launch of the script) on an unshuffled synthetic dataset where
the same rank only ever draws empty images. The tests below check
different parts of what was reported.
"""
import re

import pytest

from mmddp_ext.testing import like_a_rank, make_synthetic_coco, run_on_ranks
from ...helpers import data_options, rank0_log, tiny_options, train_on_ranks
from ...test_models.dino_utils import (ddp_step_report, global_relative_error,
                                       loss_and_grads, raw_batch,
                                       relative_errors)
from .rtdetr_utils import (TINY_CONFIG, build_tiny,
                           drop_dn_padding_of_gt_less_images)

EMPTY_RANK = 1
# GT count of each of a rank's 2 images; the ranks with GT share the same
# maximum (2), so the dn group count matches the single-process batch.
GT_COUNTS = {2: [[2, 1], [0, 0]], 3: [[2, 1], [0, 0], [1, 2]]}
# With an unshuffled sampler, rank r reads images r, r + W, ...
EMPTY_IMAGES = {2: 'odd', 3: 'mod3:1'}
TRAIN_ITERS = 3
NUM_DECODER_LAYERS = 2


def _ddp_steps(gt_counts):
    """Two plain-DDP passes of this rank's fixed batch (see
    ``ddp_step_report``); only rank 0 keeps its gradients."""
    import torch.distributed as dist
    rank = dist.get_rank()
    report = ddp_step_report(
        build_tiny(deterministic=True),
        raw_batch(gt_counts[rank], first_index=2 * rank))
    if rank != 0:
        report['grads'] = None
    return report


@pytest.fixture(scope='module', params=[2, 3], ids=['2ranks', '3ranks'])
def dist_run(request, tmp_path_factory):
    world_size = request.param
    root = tmp_path_factory.mktemp(f'rtdetr_{world_size}')
    steps = run_on_ranks(
        _ddp_steps, world_size, args=(GT_COUNTS[world_size], ), timeout=120)
    make_synthetic_coco(
        str(root / 'train'),
        num_images=world_size * 2 * TRAIN_ITERS,
        empty=EMPTY_IMAGES[world_size])
    make_synthetic_coco(str(root / 'val'), num_images=2, seed=1)
    work_dir = str(root / 'work')
    options = data_options(str(root)) + tiny_options(TRAIN_ITERS) + [
        'train_dataloader.sampler.shuffle=False',
        'model_wrapper_cfg.type=MMDistributedDataParallel',
        'model_wrapper_cfg.find_unused_parameters=False',
    ]
    output = train_on_ranks(TINY_CONFIG, world_size, work_dir, options,
                            timeout=150)
    assert output.returncode == 0, output.stdout[-4000:]
    return world_size, steps, output, rank0_log(work_dir)


def test_same_loss_keys_collectives_and_gradients_on_every_rank(dist_run):
    world_size, steps, _, _ = dist_run
    assert len(steps) == world_size
    for rank, step in enumerate(steps):
        assert step['loss_keys'] == steps[0]['loss_keys'], rank
        assert step['all_reduce_calls'] == steps[0]['all_reduce_calls']
        assert step['missing_grads'] == [], rank
        assert step['grad_checksum'] == steps[0]['grad_checksum'], rank
        for key, value in step['loss_values'].items():
            assert abs(value) < float('inf'), (rank, key)  # NaN fails too
    # One reduce_mean of the GT count per loss-term set: matching and dn
    # per decoder layer, and the encoder.
    assert len(steps[0]['all_reduce_calls']) == 2 * NUM_DECODER_LAYERS + 1
    assert {'dn_loss_cls', 'd0.dn_loss_bbox',
            'enc_loss_cls'} <= set(steps[0]['loss_keys'])


def test_ddp_gradient_equals_single_process(dist_run):
    """One DDP step equals one single-process step over the concatenated
    batch (fp32).

    Like-for-like normalisation: every RT-DETR loss term (VFL, L1, GIoU)
    is ``sum_i l_i / A`` with ``A`` the rank's GT count passed through
    ``reduce_mean`` (N / W for N boxes in all), so DDP's gradient average
    over W ranks is ``grad(sum_i l_i / N)``, the single-process gradient
    of the whole batch. Every BN runs on its running statistics and the
    dn noise is off, so no image's loss depends on its batch; the
    batching-dependent dn padding term of GT-less images is dropped as in
    the DINO test.
    """
    world_size, steps, _, _ = dist_run
    with like_a_rank():  # the reference on the ranks' device
        reference_model = build_tiny(deterministic=True)
        drop_dn_padding_of_gt_less_images(reference_model.bbox_head)
        all_counts = [n for rank in GT_COUNTS[world_size] for n in rank]
        _, reference = loss_and_grads(reference_model, raw_batch(all_counts))
    grads = steps[0]['grads']
    assert global_relative_error(grads, reference) < 1e-6
    errors = relative_errors(grads, reference)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])


def test_training_with_an_always_empty_rank(dist_run):
    """tools/train.py, as tools/dist_train.sh starts it, trains RT-DETR-tiny
    with plain DDP
    (find_unused_parameters=False) while one rank sees no box at all: it
    finishes, logs finite losses including the dn terms, and the
    RankConsistencyHook (on in configs/_base_/mmddp_ext.py) found the same
    loss keys on every rank at every iteration."""
    _, _, _, log = dist_run
    iters = [
        int(m)
        for m in re.findall(r'Iter\(train\) \[\s*(\d+)/\d+\].*loss: ', log)
    ]
    assert iters == list(range(1, TRAIN_ITERS + 1))
    # MMEngine logs the config: plain DDP, no unused-parameter search.
    assert re.search(
        r'model_wrapper_cfg = dict\([^)]*'
        r'find_unused_parameters=False', log), log[:5000]
    for line in re.findall(r'Iter\(train\).*', log):
        for key in ('dn_loss_cls', 'enc_loss_cls', 'd0.dn_loss_iou'):
            value = float(re.search(rf' {re.escape(key)}: (\S+)', line)[1])
            assert abs(value) < float('inf'), (key, line)
    empty_total = TRAIN_ITERS * 2
    assert re.search(rf'rank{EMPTY_RANK}_empty_samples: {empty_total}\b',
                     log), log[-3000:]
