"""DDPSafeDINOHead: zero-weight dummy targets, a connected empty dn loss."""
import torch

from ..dino_utils import build_model, loss_and_grads, raw_batch, tiny_dino_cfg


def _dn_targets(head, gt_counts, dn_meta):
    samples = raw_batch(gt_counts)['data_samples']
    return head.get_dn_targets([s.gt_instances for s in samples],
                               [s.metainfo for s in samples], dn_meta)


def test_dummy_group_targets_have_zero_weight():
    """Upstream trains every dn query of a GT-less image as background
    with weight 1; for the dummy group all weights and counts are 0."""
    stock = build_model(tiny_dino_cfg(ddp_safe=False)).bbox_head
    safe = build_model(tiny_dino_cfg(ddp_safe=True)).bbox_head
    dummy_meta = dict(
        num_denoising_queries=2, num_denoising_groups=1, dummy_dn_group=True)

    (labels, label_weights, bbox_targets, bbox_weights, num_pos,
     num_neg) = _dn_targets(safe, [0, 0], dummy_meta)
    upstream = _dn_targets(stock, [0, 0], dummy_meta)

    assert (num_pos, num_neg) == (0, 0) == tuple(upstream[4:])
    for weights in label_weights + bbox_weights:
        assert torch.count_nonzero(weights) == 0
    assert all(torch.all(w == 1) for w in upstream[1])
    for got, expected in zip((labels, bbox_targets, bbox_weights),
                             (upstream[0], upstream[2], upstream[3])):
        assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_real_groups_keep_upstream_targets():
    """Without the dummy flag (any batch with GT, even next to a GT-less
    image) the targets are upstream's, padding negatives included."""
    stock = build_model(tiny_dino_cfg(ddp_safe=False)).bbox_head
    safe = build_model(tiny_dino_cfg(ddp_safe=True)).bbox_head
    dn_meta = dict(
        num_denoising_queries=20, num_denoising_groups=5, dummy_dn_group=False)
    got = _dn_targets(safe, [2, 0], dn_meta)
    expected = _dn_targets(stock, [2, 0], dn_meta)
    assert got[4:] == expected[4:] == (10, 10)
    for got_list, expected_list in zip(got[:4], expected[:4]):
        for g, e in zip(got_list, expected_list):
            assert torch.equal(g, e)


def test_empty_dn_part_loss_stays_in_graph():
    """With mmdet's generator (empty dn part on a GT-less batch) upstream
    returns a detached zero for every dn classification loss; this head
    returns a connected, finite zero."""
    stock_model = build_model(tiny_dino_cfg(ddp_safe=False))
    head_only = build_model(
        tiny_dino_cfg(ddp_safe=False, head='DDPSafeDINOHead'))
    batch = raw_batch([0, 0])
    stock_losses, _ = loss_and_grads(stock_model, batch)
    losses, grads = loss_and_grads(head_only, batch)

    assert list(losses) == list(stock_losses)
    assert not stock_losses['dn_loss_cls'].requires_grad
    for key, value in losses.items():
        assert value.requires_grad, key
        assert torch.isfinite(value).all(), key
    assert losses['dn_loss_cls'].item() == 0.0
    assert all(grad is not None for grad in grads.values())
