"""The seams between the model ports: a port built on another varies it
through constructor arguments and builder methods, and reaches it only
through its package's public names.

- DEIM's RT-DETRv2 decoder layers are RT-DETR's ``RTDETRDecoderLayer``
  with ``activation='silu'``: no forward of DEIM's own.
- ``DFINEHybridEncoder`` overrides only ``HybridEncoder``'s ``_build_*``
  methods: no ``__init__`` or ``forward`` of its own.
- No file of a project package imports another project's internal module
  or takes a name its package does not export (``__all__``); the
  negative controls plant such imports and see them flagged.
"""
import ast
import glob
import os.path as osp

import pytest
import torch
from torch import nn

from .test_deim.deim_utils import import_dfine
from .test_deim.test_deim_head import _tiny_deim_rtdetr
from .test_rtdetr.rtdetr_utils import import_project as import_rtdetr

PROJECTS = osp.join(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))), 'projects')
IMPORTERS = ('import_module', '__import__')
# Files known to reach into another project's modules, each asserted to
# still do so: fixing one makes the test fail until it leaves this list.
KNOWN_REACHES = set()


def _package_faces(root: str) -> dict:
    """``{'projects.<Name>.<pkg>': names in its __all__}`` for every
    project package below ``root``, read from the source (no import)."""
    faces = {}
    for init in glob.glob(osp.join(root, '*', '*', '__init__.py')):
        package = osp.dirname(init)
        name = '.'.join([
            'projects',
            osp.basename(osp.dirname(package)),
            osp.basename(package)
        ])
        exported = set()
        for node in ast.parse(open(init).read()).body:
            if (isinstance(node, ast.Assign) and any(
                    getattr(t, 'id', None) == '__all__'
                    for t in node.targets)):
                exported = set(ast.literal_eval(node.value))
        faces[name] = exported
    return faces


def _imported_name(call: ast.Call):
    func = call.func
    func_name = getattr(func, 'attr', getattr(func, 'id', None))
    if func_name not in IMPORTERS or not call.args:
        return None
    arg = call.args[0]
    return arg.value if isinstance(arg, ast.Constant) else '<computed>'


def cross_project_reaches(root: str) -> dict:
    """Offences per file (path relative to ``root``): an import of
    another project by name that is not its package face, or a name taken
    from a face that its ``__all__`` does not export."""
    faces = _package_faces(root)
    offences = {}
    for path in sorted(glob.glob(osp.join(root, '*', '*', '*.py'))):
        relative = osp.relpath(path, root)
        own = 'projects.' + '.'.join(relative.split(osp.sep)[:2])
        tree = ast.parse(open(path).read())
        found, bound = [], {}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = _imported_name(node)
            if name is None or name == own or name.startswith(own + '.'):
                continue
            if name not in faces:
                found.append(f'imports {name!r}, not a package face')
        for node in ast.walk(tree):
            if (isinstance(node, ast.Assign)
                    and isinstance(node.value, ast.Call)):
                name = _imported_name(node.value)
                if name in faces and name != own:
                    for target in node.targets:
                        bound[getattr(target, 'id', None)] = name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id in bound):
                face = bound[node.value.id]
                if node.attr not in faces[face]:
                    found.append(f'takes {node.attr!r} from {face!r}, '
                                 'which its __all__ does not export')
        if found:
            offences[relative] = found
    return offences


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


def test_projects_reach_each_other_through_package_faces():
    """Every cross-project import in projects/ names a package face and
    takes only exported names; the files in ``KNOWN_REACHES`` still reach
    past one (so the list shrinks when they are fixed)."""
    offences = cross_project_reaches(PROJECTS)
    assert set(offences) == KNOWN_REACHES, offences


OLD_RTDETR_PORT = """
import importlib
_rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
_layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
HybridEncoder = _rtdetr.HybridEncoder
ConvNormLayer = _layers.ConvNormLayer
Hidden = _rtdetr.Hidden
"""


def test_reach_scan_flags_planted_imports(tmp_path):
    """Negative control: the scan flags an import of another project's
    internal module (D-FINE's port before this change) and a name the
    face does not export; the same files with face-only imports pass."""
    face = tmp_path / 'RT-DETR' / 'rtdetr'
    face.mkdir(parents=True)
    (face / '__init__.py'
     ).write_text("__all__ = ['HybridEncoder', 'ConvNormLayer']\n")
    (face / 'rtdetr_layers.py').write_text('ConvNormLayer = None\n')
    port = tmp_path / 'D-FINE' / 'dfine'
    port.mkdir(parents=True)
    (port / '__init__.py').write_text('__all__ = []\n')
    (port / 'rtdetr_port.py').write_text(OLD_RTDETR_PORT)
    offences = cross_project_reaches(str(tmp_path))
    assert offences == {
        osp.join('D-FINE', 'dfine', 'rtdetr_port.py'): [
            "imports 'projects.RT-DETR.rtdetr.rtdetr_layers', not a "
            'package face',
            "takes 'Hidden' from 'projects.RT-DETR.rtdetr', which its "
            '__all__ does not export'
        ]
    }
    (port / 'rtdetr_port.py').write_text(
        "from importlib import import_module\n"
        "_rtdetr = import_module('projects.RT-DETR.rtdetr')\n"
        'ConvNormLayer = _rtdetr.ConvNormLayer\n')
    assert cross_project_reaches(str(tmp_path)) == {}
