"""DDPSafeDINO in one process: bit-identical to DINO when batches have GT,
and a dummy dn group that contributes exactly zero when they have none."""
import pytest
import torch

from ..dino_utils import (build_model, global_relative_error, loss_and_grads,
                          loss_values, raw_batch, relative_errors,
                          tiny_dino_cfg)


def _stock_and_safe():
    return (build_model(tiny_dino_cfg(ddp_safe=False)),
            build_model(tiny_dino_cfg(ddp_safe=True)))


def test_init_is_bit_identical_to_dino():
    from mmddp_ext.models import DDPSafeCdnQueryGenerator
    stock, safe = _stock_and_safe()
    assert type(safe.dn_query_generator) is DDPSafeCdnQueryGenerator
    stock_state, safe_state = stock.state_dict(), safe.state_dict()
    # Same names in the same order: DDP buckets and optimizer groups match.
    assert list(stock_state) == list(safe_state)
    for name, value in stock_state.items():
        assert torch.equal(value, safe_state[name]), name


def test_training_is_bit_identical_to_dino_when_batches_have_gt():
    """Two AdamW steps; some images are empty but every batch has GT."""
    stock, safe = _stock_and_safe()
    optimizers = [
        torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (stock, safe)
    ]
    for step, gt_counts in enumerate([[2, 0], [1, 3]]):
        batch = raw_batch(gt_counts, first_index=2 * step)
        torch.manual_seed(step)
        stock_losses, stock_grads = loss_and_grads(stock, batch)
        torch.manual_seed(step)
        safe_losses, safe_grads = loss_and_grads(safe, batch)
        assert list(stock_losses) == list(safe_losses)
        for key, value in stock_losses.items():
            assert torch.equal(value, safe_losses[key]), (step, key)
        for name, grad in stock_grads.items():
            assert grad is not None, name
            assert torch.equal(grad, safe_grads[name]), (step, name)
        for optimizer in optimizers:
            optimizer.step()
    for (name, p_stock), p_safe in zip(stock.named_parameters(),
                                       safe.parameters()):
        assert torch.equal(p_stock, p_safe), name


def _capture_decoder_activations(model):
    """Keep every decoder layer's input and output queries and their
    gradients; returns the list and the hook handles."""
    captured, handles = [], []

    def keep(tensor):
        tensor.retain_grad()
        captured.append(tensor)

    for layer in model.decoder.layers:
        handles.append(
            layer.register_forward_pre_hook(
                lambda module, args, kwargs: keep(args[0]), with_kwargs=True))
        handles.append(
            layer.register_forward_hook(
                lambda module, args, output: keep(output)))
    return captured, handles


DN_KEYS = ('dn_loss_cls', 'dn_loss_bbox', 'dn_loss_iou')


def test_dummy_group_gets_exactly_zero_gradient():
    """GT-less batch: the dummy's loss terms are exactly 0 yet connected,
    and the gradient reaching the dummy rows is exactly 0 at every decoder
    layer, so every gradient contribution made through the dummy is an
    exact zero; ``label_embedding`` gets an all-zero gradient."""
    safe = build_model(tiny_dino_cfg(ddp_safe=True))
    captured, handles = _capture_decoder_activations(safe)
    losses, grads = loss_and_grads(safe, raw_batch([0, 0]))
    for handle in handles:
        handle.remove()

    num_dummy = 2
    assert len(captured) == 2 * len(safe.decoder.layers)
    for activation in captured:
        assert activation.shape[1] == num_dummy + safe.num_queries
        assert torch.count_nonzero(activation.grad[:, :num_dummy]) == 0
        assert torch.count_nonzero(activation.grad[:, num_dummy:]) > 0
    for key, value in losses.items():
        assert value.requires_grad, key  # upstream: dn_loss_cls detached
        assert torch.isfinite(value).all(), key
        if key.endswith(DN_KEYS):
            assert value.item() == 0.0, key
    embedding = grads['dn_query_generator.label_embedding.weight']
    assert torch.equal(embedding, torch.zeros_like(embedding))
    assert all(grad is not None for grad in grads.values())


def test_dummy_group_changes_no_gradient():
    """Same GT-less batch with the dummy (DDPSafeDINO) and without it
    (mmdet's DINO: empty dn part). Every loss value and gradient agrees to
    fp32 rounding: the dummy adds exact zeros, but its two rows per image
    lengthen the decoder's matmul and softmax reductions, which
    reassociates fp32 sums (measured: bitwise-equal losses, gradients
    within ~3e-6 per tensor and ~2e-7 overall; fp64 in the next test).
    Control: the same dummy under mmdet's DINOHead is a background
    negative with weight 1 and moves the gradient by orders more."""
    stock, safe = _stock_and_safe()
    batch = raw_batch([0, 0])
    stock_losses, stock_grads = loss_and_grads(stock, batch)
    safe_losses, safe_grads = loss_and_grads(safe, batch)
    stock.dn_query_generator = safe.dn_query_generator  # the control
    _, negative_dummy_grads = loss_and_grads(stock, batch)

    assert list(safe_losses) == list(stock_losses)
    for key, value in loss_values(stock_losses).items():
        assert loss_values(safe_losses)[key] == pytest.approx(
            value, rel=1e-6, abs=0), key
    assert global_relative_error(safe_grads, stock_grads) < 1e-6
    for name, error in relative_errors(safe_grads, stock_grads).items():
        assert error < 1e-5, name
    assert global_relative_error(negative_dummy_grads, stock_grads) > 1e-3


def test_dummy_group_changes_no_gradient_in_fp64():
    """The previous comparison in fp64, where reassociation costs ~1e-16:
    every loss value and every parameter's gradient agree to 1e-12, so the
    fp32 differences are rounding, not a contribution of the dummy."""
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        stock, safe = (model.double() for model in _stock_and_safe())
        batch = raw_batch([0])
        stock_losses, stock_grads = loss_and_grads(stock, batch)
        safe_losses, safe_grads = loss_and_grads(safe, batch)
    finally:
        torch.set_default_dtype(default_dtype)
    assert safe_grads['backbone.conv1.weight'].dtype == torch.float64
    for key, value in loss_values(stock_losses).items():
        assert loss_values(safe_losses)[key] == pytest.approx(
            value, rel=1e-12, abs=0), key
    for name, error in relative_errors(safe_grads, stock_grads).items():
        assert error < 1e-12, name


def test_requires_the_ddp_safe_head():
    cfg = tiny_dino_cfg(ddp_safe=True, head='DINOHead')
    with pytest.raises(TypeError, match='DDPSafeDINOHead'):
        build_model(cfg)


def test_requires_dn_cfg():
    cfg = tiny_dino_cfg(ddp_safe=True)
    cfg.dn_cfg = None
    with pytest.raises(ValueError, match='dn_cfg'):
        build_model(cfg)
