"""CO-DINO on 2 and 3 real gloo ranks, one of which only sees GT-less
images, under ``DistributedDataParallel(find_unused_parameters=False)``.

Each world size spawns its ranks once (``dist_run``). Every rank runs two
DDP steps of the tiny CO-DINO (query head with denoising, ATSS and
RPN + RoI auxiliary heads and their positive query groups) on a fixed
batch, then one step of the deterministic variant whose gradient is
compared with a single process.
"""
import pytest
import torch

from mmddp_ext.testing import run_on_ranks
from ...test_models.dino_utils import (counting_all_reduce,
                                       drop_dn_padding_of_gt_less_images,
                                       global_relative_error, loss_and_grads,
                                       loss_values, raw_batch, relative_errors)
from .codetr_utils import build_tiny, tiny_model_cfg

# Per rank, the GT count of each of its 2 images; rank 1 has none. Every
# rank with GT has the same maximum (2), so the dynamic dn grouping is the
# same on those ranks and in the single-process batch.
GT_COUNTS = {2: [[2, 1], [0, 0]], 3: [[2, 1], [0, 0], [1, 2]]}
NUM_DEC_LAYERS = 2
NUM_AUX_HEADS = 2


def _ddp_steps(model, batch, passes):
    """``passes`` DDP forward/backward passes; reports the first one, with
    the shape of every ``dist.all_reduce`` it issued. Later passes make
    DDP's reducer check that every parameter was reduced."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(model, find_unused_parameters=False)
    calls = []
    real_all_reduce, dist.all_reduce = counting_all_reduce(calls)
    try:
        losses, grads = loss_and_grads(model, batch, forward=ddp)
        first_calls = list(calls)
        for _ in range(passes - 1):
            loss_and_grads(model, batch, forward=ddp)
    finally:
        dist.all_reduce = real_all_reduce
    return losses, grads, first_calls


def _rank_main(gt_counts):
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = dist.get_rank()
    batch = raw_batch(gt_counts[rank], first_index=2 * rank)
    losses, grads, calls = _ddp_steps(
        build_tiny(tiny_model_cfg()), batch, passes=2)
    _, det_grads, _ = _ddp_steps(
        build_tiny(tiny_model_cfg(deterministic=True)), batch, passes=1)
    return dict(
        loss_keys=list(losses),
        loss_values=loss_values(losses),
        all_reduce_calls=calls,
        missing_grads=[name for name, g in grads.items() if g is None],
        grad_checksum=sum(g.double().sum().item() for g in grads.values()),
        det_grads=det_grads if rank == 0 else None)


@pytest.fixture(scope='module', params=[2, 3], ids=['2ranks', '3ranks'])
def dist_run(request):
    world_size = request.param
    results = run_on_ranks(
        _rank_main, world_size, args=(GT_COUNTS[world_size], ), timeout=150)
    return world_size, results


def test_same_loss_keys_collectives_and_gradients_on_every_rank(dist_run):
    world_size, results = dist_run
    assert len(results) == world_size
    first = results[0]
    for rank, result in enumerate(results):
        assert result['loss_keys'] == first['loss_keys'], rank
        assert result['all_reduce_calls'] == first['all_reduce_calls'], rank
        assert result['missing_grads'] == [], rank
        # DDP averaged the gradients: bit-identical on every rank.
        assert result['grad_checksum'] == first['grad_checksum'], rank
        for key, value in result['loss_values'].items():
            assert abs(value) < float('inf'), (rank, key)  # NaN fails too
    # reduce_mean of the two average factors of every loss-term set:
    # matching and dn per decoder layer, the encoder proposals, ATSS, and
    # each auxiliary query group per decoder layer.
    per_set = 2
    expected = per_set * (2 * NUM_DEC_LAYERS + 1 + 1 +
                          NUM_AUX_HEADS * NUM_DEC_LAYERS)
    assert len(first['all_reduce_calls']) == expected
    keys = set(first['loss_keys'])
    assert {
        'dn_loss_cls', 'enc_loss_cls', 'loss_rpn_cls', 'loss_cls0',
        'loss_centerness1', 'loss_cls_aux0', 'd0.loss_iou_aux1'
    } <= keys


def test_ddp_gradient_equals_single_process(dist_run):
    """One DDP step equals one single-process step over the concatenated
    batch (fp32, relative 1e-6 over all parameters).

    Like-for-like normalisation: every term of the deterministic model
    (DINO matching, dn and encoder terms, ATSS, the ATSS positive query
    groups) is a sum over the rank's images divided by a count passed
    through ``reduce_mean``, so DDP's gradient average equals the
    single-process gradient over all images. The auxiliary query groups
    are padded with zero-weight queries masked out of self-attention, so
    each image's queries do not depend on its batch. See
    ``tiny_model_cfg(deterministic=True)`` for what else is fixed.
    """
    world_size, results = dist_run
    reference_model = build_tiny(tiny_model_cfg(deterministic=True))
    drop_dn_padding_of_gt_less_images(reference_model.query_head)
    counts = [n for rank in GT_COUNTS[world_size] for n in rank]
    _, reference = loss_and_grads(reference_model, raw_batch(counts))
    grads = results[0]['det_grads']
    assert global_relative_error(grads, reference) < 1e-6
    errors = relative_errors(grads, reference)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])
