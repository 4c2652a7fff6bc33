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
    monkeypatch.setattr(folding, 'tensor_version', lambda tensor: 0)
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
