"""DDPSafeCdnQueryGenerator: the dummy group, and upstream's path with GT."""
import pytest
import torch

EMBED_DIMS = 8
NUM_MATCHING = 5


def _generators(group_cfg=None):
    """An upstream and a DDP-safe generator with identical weights."""
    from mmdet.models.layers import CdnQueryGenerator

    from mmddp_ext.models import DDPSafeCdnQueryGenerator
    kwargs = dict(
        num_classes=3,
        embed_dims=EMBED_DIMS,
        num_matching_queries=NUM_MATCHING,
        group_cfg=group_cfg or dict(dynamic=True, num_dn_queries=10))
    upstream = CdnQueryGenerator(**kwargs)
    safe = DDPSafeCdnQueryGenerator(**kwargs)
    safe.load_state_dict(upstream.state_dict())
    return upstream, safe


def _samples(gt_counts):
    from ..dino_utils import raw_batch
    return raw_batch(gt_counts)['data_samples']


@pytest.mark.parametrize('group_cfg', [
    dict(dynamic=True, num_dn_queries=10),
    dict(dynamic=False, num_groups=4),
])
def test_no_gt_gives_one_consistent_dummy_group(group_cfg):
    _, safe = _generators(group_cfg)
    label_query, bbox_query, attn_mask, dn_meta = safe(_samples([0, 0, 0]))

    assert dn_meta == dict(
        num_denoising_queries=2, num_denoising_groups=1, dummy_dn_group=True)
    assert label_query.shape == (3, 2, EMBED_DIMS)
    assert bbox_query.shape == (3, 2, 4)
    assert attn_mask.shape == (2 + NUM_MATCHING, 2 + NUM_MATCHING)
    # Reference boxes sigmoid(0) = (0.5, 0.5, 0.5, 0.5): finite and valid.
    assert torch.equal(bbox_query, torch.zeros(3, 2, 4))
    # Matching queries cannot see the dummy; the dummy sees itself and the
    # matching queries, as one upstream group of one target would.
    assert attn_mask[2:, :2].all()
    assert not attn_mask[:2].any()
    assert not attn_mask[2:, 2:].any()
    # The label queries come from the embedding, so it stays in the graph.
    weight = safe.label_embedding.weight
    assert torch.equal(label_query, weight[0].expand(3, 2, EMBED_DIMS))
    (label_query * 0).sum().backward()
    assert weight.grad is not None
    assert torch.equal(weight.grad, torch.zeros_like(weight))


def test_no_gt_draws_no_random_numbers():
    _, safe = _generators()
    state = torch.get_rng_state()
    safe(_samples([0, 0]))
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize('gt_counts', [[2, 1], [0, 3], [1, 0, 0]])
def test_with_gt_is_upstream_bit_for_bit(gt_counts):
    """Any GT in the batch (also next to GT-less images): same outputs and
    the same RNG consumption as mmdet's CdnQueryGenerator."""
    upstream, safe = _generators()
    samples = _samples(gt_counts)
    torch.manual_seed(7)
    expected = upstream(samples)
    state_after_upstream = torch.get_rng_state()
    torch.manual_seed(7)
    got = safe(samples)

    assert torch.equal(torch.get_rng_state(), state_after_upstream)
    for exp, out in zip(expected[:3], got[:3]):
        assert torch.equal(exp, out)
    assert got[3] == dict(expected[3], dummy_dn_group=False)
    assert got[3]['num_denoising_queries'] > 0


def test_registry_builds_the_ddp_safe_generator():
    """Configs name it by type: what the registry builds must give a
    GT-less batch the dummy group (mmdet's gives zero dn queries)."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    import mmddp_ext  # noqa: F401
    register_all_modules()
    generator = MODELS.build(
        dict(
            type='DDPSafeCdnQueryGenerator',
            num_classes=3,
            embed_dims=EMBED_DIMS,
            num_matching_queries=NUM_MATCHING,
            group_cfg=dict(dynamic=True, num_dn_queries=10)))
    *_, dn_meta = generator(_samples([0, 0]))
    assert dn_meta['dummy_dn_group'] is True
    assert dn_meta['num_denoising_queries'] == 2
