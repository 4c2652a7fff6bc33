"""The seams between the model ports: a port built on another varies it
through constructor arguments and builder methods.

- DEIM's RT-DETRv2 decoder layers are RT-DETR's ``RTDETRDecoderLayer``
  with ``activation='silu'``: no forward of DEIM's own.
- ``DFINEHybridEncoder`` overrides only ``HybridEncoder``'s ``_build_*``
  methods: no ``__init__`` or ``forward`` of its own.

How the projects reach one another (the README's ``Requires`` line, one
``ports.py``, only exported names) is read from the sources by
tests/test_house/test_project_seams.py.
"""
import pytest
import torch
from torch import nn

from .test_deim.deim_utils import import_dfine
from .test_deim.test_deim_head import _tiny_deim_rtdetr
from .test_rtdetr.rtdetr_utils import import_project as import_rtdetr


def test_deim_decoder_layers_are_rtdetr_layers():
    """DEIM's RT-DETRv2 decoder layers run ``RTDETRDecoderLayer.forward``
    itself; the activation is its constructor argument (SiLU here), and
    switching it changes the output but no state-dict key."""
    rtdetr = import_rtdetr()
    model = _tiny_deim_rtdetr()
    for layer in model.decoder.layers:
        assert type(layer).forward is rtdetr.RTDETRDecoderLayer.forward
        assert isinstance(layer.activation, nn.SiLU)
    torch.manual_seed(0)
    dims = dict(
        embed_dims=32, num_heads=2, feedforward_channels=64, num_levels=1)
    silu = rtdetr.RTDETRDecoderLayer(activation='silu', **dims)
    relu = rtdetr.RTDETRDecoderLayer(**dims)
    assert isinstance(relu.activation, nn.ReLU)  # RT-DETR's default
    relu.load_state_dict(silu.state_dict())  # strict: the same keys
    shapes = torch.tensor([[2, 2]])
    inputs = (torch.randn(1, 3, 32), torch.randn(1, 3, 32),
              torch.randn(1, 4, 32), torch.rand(1, 3,
                                                4), shapes, torch.tensor([0]))
    assert not torch.allclose(silu(*inputs), relu(*inputs))
    with pytest.raises(ValueError, match='decoder.layer_cfg.activation'):
        rtdetr.RTDETRDecoderLayer(activation='tanh', **dims)


def test_dfine_encoder_overrides_only_builders():
    """``DFINEHybridEncoder`` defines no ``__init__`` or ``forward``: it
    overrides ``HybridEncoder``'s builder methods and nothing else, and
    its modules are D-FINE's."""
    rtdetr, dfine = import_rtdetr(), import_dfine()
    builders = {
        name
        for name in vars(rtdetr.HybridEncoder) if name.startswith('_build_')
    }
    assert builders == {
        '_build_input_proj', '_build_lateral_conv', '_build_fusion_block',
        '_build_downsample_conv'
    }
    methods = {
        name
        for name, value in vars(dfine.DFINEHybridEncoder).items()
        if callable(value)
    }
    assert methods == builders
    for name in ('__init__', 'forward', '_fuse', '_encode_level'):
        assert (getattr(dfine.DFINEHybridEncoder, name)
                is getattr(rtdetr.HybridEncoder, name)), name
    encoder = dfine.DFINEHybridEncoder(
        in_channels=(8, 16),
        hidden_dim=16,
        use_encoder_idx=(1, ),
        feedforward_channels=32,
        expansion=0.5,
        depth_mult=0.34)
    layer_types = {
        name: type(module[0]).__name__
        for name, module in (('fpn', encoder.fpn_blocks),
                             ('down', encoder.downsample_convs[0]))
    }
    assert layer_types == {'fpn': 'RepNCSPELAN4', 'down': 'SCDown'}
    assert set(dict(
        encoder.input_proj[0].named_children())) == {'conv', 'norm'}
    with pytest.raises(ValueError, match='DFINEHybridEncoder use_encoder'):
        dfine.DFINEHybridEncoder(in_channels=(8, 16), use_encoder_idx=(2, ))
