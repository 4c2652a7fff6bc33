"""CO-DINO on 2 and 3 real gloo ranks, one of which only sees GT-less
images, under ``DistributedDataParallel(find_unused_parameters=False)``.

Each world size spawns its ranks once (``dist_run``). Every rank runs two
DDP steps of the tiny CO-DINO (query head with denoising, ATSS and
RPN + RoI auxiliary heads and their positive query groups) on a fixed
batch, then one step of the deterministic variant (every branch still
in) whose gradient is compared with a single process.
"""
import pytest
import torch

from mmddp_ext.testing import like_a_rank, run_on_ranks
from ...test_models.dino_utils import (ddp_step_report,
                                       drop_dn_padding_of_gt_less_images,
                                       global_relative_error, loss_and_grads,
                                       raw_batch, relative_errors)
from .codetr_utils import build_tiny, tiny_model_cfg

# Per rank, the GT count of each of its 2 images; rank 1 has none. Every
# rank with GT has the same maximum (2), so the dynamic dn grouping is the
# same on those ranks and in the single-process batch.
GT_COUNTS = {2: [[2, 1], [0, 0]], 3: [[2, 1], [0, 0], [1, 2]]}
NUM_DEC_LAYERS = 2
NUM_AUX_HEADS = 2


def _rank_main(gt_counts):
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = dist.get_rank()
    batch = raw_batch(gt_counts[rank], first_index=2 * rank)
    report = ddp_step_report(build_tiny(tiny_model_cfg()), batch, passes=2)
    deterministic = ddp_step_report(
        build_tiny(tiny_model_cfg(deterministic=True)), batch, passes=1)
    report['grads'] = None
    report['det_grads'] = deterministic['grads'] if rank == 0 else None
    return report


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


def _chunks(images_per_rank, batch_size):
    """Image slices of the ranks of a ``batch_size`` batch."""
    if batch_size % images_per_rank:
        raise ValueError(f'{batch_size} images do not split into ranks of '
                         f'{images_per_rank}')
    return [
        slice(start, start + images_per_rank)
        for start in range(0, batch_size, images_per_rank)
    ]


def _mean_of_chunks(chunk_losses):
    """Per key, the mean over the ranks' loss dicts (lists per level)."""
    merged = {}
    for key, first in chunk_losses[0].items():
        values = [losses[key] for losses in chunk_losses]
        if isinstance(first, (list, tuple)):
            merged[key] = [sum(level) / len(values) for level in zip(*values)]
        else:
            merged[key] = sum(values) / len(values)
    return merged


def normalise_rpn_roi_per_rank(model, images_per_rank):
    """Make ``model``'s RPN and RoI losses those of DDP over ranks of
    ``images_per_rank`` consecutive images.

    mmdet's ``AnchorHead.loss_by_feat`` and ``BBoxHead.loss_and_target``
    divide each rank's sum by that rank's own sample count. Patched here:
    each rank-chunk of the batch gets its loss with its own count, and the
    chunk losses are averaged, as DDP averages the ranks' gradients.
    """
    rpn_head = model.rpn_head
    rpn_loss = rpn_head.loss_by_feat

    def rpn_loss_per_rank(cls_scores,
                          bbox_preds,
                          batch_gt_instances,
                          batch_img_metas,
                          batch_gt_instances_ignore=None):
        ignore = batch_gt_instances_ignore or [None] * len(batch_img_metas)
        return _mean_of_chunks([
            rpn_loss([s[rows] for s in cls_scores],
                     [b[rows] for b in bbox_preds], batch_gt_instances[rows],
                     batch_img_metas[rows], ignore[rows])
            for rows in _chunks(images_per_rank, len(batch_img_metas))
        ])

    rpn_head.loss_by_feat = rpn_loss_per_rank
    for roi_head in model.roi_head:
        bbox_head = roi_head.bbox_head
        roi_loss = bbox_head.loss_and_target

        def roi_loss_per_rank(cls_score,
                              bbox_pred,
                              rois,
                              sampling_results,
                              rcnn_train_cfg,
                              bbox_head=bbox_head,
                              roi_loss=roi_loss,
                              **kwargs):
            counts = [len(res.priors) for res in sampling_results]
            chunk_losses = []
            for images in _chunks(images_per_rank, len(counts)):
                rows = slice(
                    sum(counts[:images.start]), sum(counts[:images.stop]))
                chunk_losses.append(
                    roi_loss(cls_score[rows], bbox_pred[rows], rois[rows],
                             sampling_results[images], rcnn_train_cfg,
                             **kwargs)['loss_bbox'])
            return dict(
                loss_bbox=_mean_of_chunks(chunk_losses),
                bbox_targets=bbox_head.get_targets(sampling_results,
                                                   rcnn_train_cfg))

        bbox_head.loss_and_target = roi_loss_per_rank


def test_ddp_gradient_equals_single_process(dist_run):
    """One DDP step equals one single-process step over the concatenated
    batch (fp32, relative 1e-6 over all parameters) for the whole model:
    query head, ATSS, RPN, RoI and both auxiliary query groups.

    Like-for-like normalisation: the query-head terms (DINO matching, dn,
    encoder, both auxiliary query groups) and ATSS are sums over the
    rank's images divided by a count passed through ``reduce_mean``, so
    DDP's gradient average equals the single-process gradient over all
    images unchanged: with ``N = reduce_mean(n_r) = sum_r n_r / W``,
    ``mean_r grad(sum_{i in r} l_i / N) = grad(sum_i l_i / sum_r n_r)``.
    mmdet's RPN and RoI losses divide by the rank's own sample count
    ``n_r`` instead (no all-reduce, as upstream CO-DETR trains them), so
    DDP's gradient is ``mean_r grad(sum_{i in r} l_i / n_r)``, which one
    division over the whole batch does not give; the reference computes
    exactly that with ``normalise_rpn_roi_per_rank`` and nothing else
    changes. Each image's proposals, samples and queries do not depend on
    its batch (see ``tiny_model_cfg(deterministic=True)``); without the
    per-rank patch the RPN/RoI tensors miss by about 1e-2.
    """
    world_size, results = dist_run
    with like_a_rank():  # the reference on the ranks' device
        reference_model = build_tiny(tiny_model_cfg(deterministic=True))
        drop_dn_padding_of_gt_less_images(reference_model.query_head)
        normalise_rpn_roi_per_rank(reference_model,
                                   len(GT_COUNTS[world_size][0]))
        counts = [n for rank in GT_COUNTS[world_size] for n in rank]
        _, reference = loss_and_grads(reference_model, raw_batch(counts))
    grads = results[0]['det_grads']
    two_stage = {
        name: grad
        for name, grad in reference.items()
        if name.startswith(('rpn_head.', 'roi_head.'))
    }
    for name in ('rpn_head.rpn_conv.weight',
                 'roi_head.0.bbox_head.fc_cls.weight'):
        assert two_stage[name].abs().sum() > 0, name
    assert global_relative_error(grads, reference) < 1e-6
    # The RPN + RoI gradients are small next to the whole model's.
    assert global_relative_error(grads, two_stage) < 1e-6
    errors = relative_errors(grads, reference)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])
