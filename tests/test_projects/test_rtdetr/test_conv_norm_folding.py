"""Inference runs conv + BatchNorm (and RepVGG's two branches) as one
folded conv: the same values as the layers run one by one, the norm not
run at all, and a refold whenever a weight or statistic changes."""
import importlib

import pytest
import torch
from torch import nn

from mmddp_ext.utils import torch_private

folding = importlib.import_module('projects.RT-DETR.rtdetr.conv_norm_folding')
layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
hgnet_layers = importlib.import_module('projects.D-FINE.dfine.hgnetv2_layers')


def _randomise(module: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, value in module.state_dict().items():
            if not value.dtype.is_floating_point:
                continue
            noise = torch.randn(value.shape, generator=gen)
            value.copy_(noise.abs() + 0.5 if name.endswith('running_var')
                        else noise * 0.5)


def _reference(layer, x):
    """The layer run module by module, as upstream runs it."""
    if isinstance(layer, layers.RepVggBlock):
        return layer.act(
            layer.conv1.norm(layer.conv1.conv(x)) +
            layer.conv2.norm(layer.conv2.conv(x)))
    if isinstance(layer, layers.ConvNormLayer):
        return layer.act(layer.norm(layer.conv(x)))
    return layer.lab(layer.act(layer.bn(layer.conv(x))))


def _norms(layer):
    return [m for m in layer.modules() if isinstance(m, nn.BatchNorm2d)]


LAYERS = {
    'ConvNormLayer': lambda: layers.ConvNormLayer(8, 16, 3, 2, act='silu'),
    'RepVggBlock': lambda: layers.RepVggBlock(8, act='relu'),
    'HGNetv2 ConvBNAct': lambda: hgnet_layers.ConvBNAct(
        8, 16, 3, groups=2, use_lab=True),
}


@pytest.mark.parametrize('name', list(LAYERS))
def test_inference_is_one_folded_conv_with_the_same_values(name):
    layer = LAYERS[name]()
    _randomise(layer, 0)
    layer.eval()
    x = torch.randn(2, 8, 12, 12)
    calls = []
    for norm in _norms(layer):
        norm.register_forward_hook(lambda *_: calls.append(1))
    with torch.no_grad():
        folded = layer(x)
        assert calls == []  # the mechanism: no norm ran
        expected = _reference(layer, x)
    assert calls
    torch.testing.assert_close(folded, expected, rtol=1e-5, atol=1e-5)
    assert folding.CACHE in vars(layer)
    # recording gradients, or training, runs the layers as they are and
    # holds no folded copy of the weights
    calls.clear()
    layer(x).sum().backward()
    assert len(calls) == len(_norms(layer))
    assert folding.CACHE not in vars(layer)
    layer.train()
    calls.clear()
    with torch.no_grad():
        layer(x)
    assert len(calls) == len(_norms(layer))


def _cache_scenario(layer) -> list:
    """max |folded - reference| / max |reference| after each way a weight
    changes: an EMA-style in-place update of the model in eval mode, an
    optimizer step with new running statistics, load_state_dict and a
    dtype change."""
    x = torch.randn(2, 8, 12, 12)
    errors = []

    def check(dtype=torch.float32):
        layer.eval()
        with torch.no_grad():
            expected = _reference(layer, x.to(dtype))
            errors.append(((layer(x.to(dtype)) - expected).abs().max() /
                           expected.abs().max()).item())

    check()
    with torch.no_grad():  # an EMA update: in place, the model in eval
        for value in layer.state_dict().values():
            if value.dtype.is_floating_point:
                value.mul_(0.5).add_(0.25)
    check()
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    layer.train()
    layer(x).square().sum().backward()  # also moves the running stats
    optimizer.step()
    check()
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    for value in state.values():
        if value.dtype.is_floating_point:
            value.mul_(-1.5).add_(0.25)
    for name, value in state.items():
        if name.endswith('running_var'):
            value.abs_().add_(0.5)
    layer.load_state_dict(state)
    check()
    layer.double()
    check(torch.float64)
    return errors


@pytest.mark.parametrize('name', list(LAYERS))
def test_the_cache_refolds_after_every_change(name):
    layer = LAYERS[name]()
    _randomise(layer, 1)
    errors = _cache_scenario(layer)
    assert max(errors) < 1e-5, errors


def test_control_a_cache_blind_to_versions_returns_stale_outputs(
        monkeypatch):
    """Negative control: the same scenario with the version counter left
    out of the cache key folds once and keeps the first weights."""
    monkeypatch.setattr(torch_private, 'tensor_version', lambda tensor: 0)
    layer = LAYERS['ConvNormLayer']()
    _randomise(layer, 1)
    errors = _cache_scenario(layer)
    assert errors[0] < 1e-5
    assert errors[1] > 1e-2, errors  # the EMA update is not seen


def test_version_counter_wrapper():
    weight = torch.ones(3)
    before = torch_private.tensor_version(weight)
    weight.mul_(2)
    assert torch_private.tensor_version(weight) == before + 1


def _kernels(run) -> set:
    """The conv kernels (aten op names) ``run()`` calls."""
    from torch.profiler import profile
    with profile() as prof:
        run()
    return {e.key for e in prof.key_averages() if 'conv' in e.key}


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize('grad', [True, False])
def test_a_1x1_conv_runs_in_onednn_with_the_same_values(one_thread, grad):
    """One thread, a batch of 2 (a CPU DDP rank's case): the 1x1 ConvBNAct
    runs oneDNN's kernel in training (forward and backward) and at
    inference (folded), never torch's im2col + GEMM one, with F.conv2d's
    values and gradients up to rounding."""
    layer = hgnet_layers.ConvBNAct(32, 48, 1)
    _randomise(layer, 3)
    layer.train(grad)
    x = torch.randn(2, 32, 24, 24, requires_grad=grad)

    def run():
        with torch.set_grad_enabled(grad):
            out = layer(x)
        if grad:
            out.square().sum().backward()
        return out

    kernels = _kernels(run)
    assert 'aten::mkldnn_convolution' in kernels, kernels
    assert not any('slow_conv2d' in k for k in kernels), kernels
    x.grad = layer.conv.weight.grad = None
    ours = run()
    grads = [x.grad.clone(), layer.conv.weight.grad.clone()] if grad else []
    x.grad = layer.conv.weight.grad = None
    with torch.set_grad_enabled(grad):
        reference = _reference(layer, x)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    if grad:
        reference.square().sum().backward()
        torch.testing.assert_close(grads[0], x.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            grads[1], layer.conv.weight.grad, rtol=1e-5, atol=1e-5)


def test_control_torch_picks_im2col_for_the_same_conv(one_thread):
    """What the layer replaces: torch's F.conv2d runs the same 1x1 conv
    through its im2col + GEMM kernel (slow_conv2d) on one thread."""
    conv = nn.Conv2d(32, 48, 1, bias=False)
    x = torch.randn(2, 32, 24, 24, requires_grad=True)
    kernels = _kernels(lambda: conv(x).sum().backward())
    assert 'aten::_slow_conv2d_forward' in kernels, kernels
    assert 'aten::mkldnn_convolution' not in kernels


def test_other_dtypes_run_torchs_conv():
    layer = hgnet_layers.ConvBNAct(8, 8, 1).double()
    x = torch.randn(2, 8, 6, 6, dtype=torch.float64)
    assert not torch_private.onednn_runs(x, layer.conv.weight)
    assert layer(x).dtype == torch.float64


@pytest.mark.parametrize('batch,bias,input_grad', [(3, True, True),
                                                   (1, False, False),
                                                   (16, True, True)])
def test_pointwise_conv_gradients_are_torchs(one_thread, batch, bias,
                                             input_grad):
    """Input, weight and bias gradients of the oneDNN 1x1 conv equal
    F.conv2d's; from a batch of 16 torch's own kernel runs (oneDNN too)."""
    pointwise = importlib.import_module('projects.RT-DETR.rtdetr.'
                                        'pointwise_conv')
    conv = nn.Conv2d(24, 40, 1, bias=bias)
    x = torch.randn(batch, 24, 9, 11, requires_grad=input_grad)
    grad_out = torch.randn(batch, 40, 9, 11)
    results = []
    for run in (lambda: pointwise.conv2d(x, conv.weight, conv.bias, conv),
                lambda: conv(x)):
        conv.zero_grad()
        x.grad = None
        run().backward(grad_out)
        results.append([x.grad] + [p.grad.clone() for p in conv.parameters()])
    ours, reference = results
    for a, b in zip(ours, reference):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)

    def step():
        pointwise.conv2d(x, conv.weight, conv.bias, conv).sum().backward()

    kernels = _kernels(step)
    assert not any('slow_conv2d' in k for k in kernels), kernels
