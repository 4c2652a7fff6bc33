"""Private torch interfaces are called from one module only
(``mmddp_ext/utils/torch_private.py``), so a torch upgrade has one file to
check."""
import ast
import glob
import os.path as osp

import pytest
import torch
import torch.distributed as dist

from mmddp_ext.utils import torch_private

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
OWNER = osp.join('mmddp_ext', 'utils', 'torch_private.py')


def _torch_aliases(tree: ast.AST) -> set:
    """Names a module binds to torch or one of its submodules."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split('.')[0] == 'torch':
                    names.add(alias.asname or 'torch')
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or '').split('.')[0] == 'torch':
            names.update(a.asname or a.name for a in node.names)
    return names


def _private(name: str) -> bool:
    return name.startswith('_') and not name.startswith('__')


def private_torch_uses(source: str) -> list:
    """``from torch... import _x`` and ``<torch alias>...._x`` in
    ``source``, as ``(line, text)``."""
    tree = ast.parse(source)
    aliases = _torch_aliases(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or '').split('.')[0] == 'torch':
            modules = node.module.split('.')
            for alias in node.names:
                if _private(alias.name) or any(map(_private, modules)):
                    found.append((node.lineno, f'{node.module}.{alias.name}'))
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in aliases:
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_the_scan_finds_each_form():
    source = ('import torch\nimport torch.distributed as dist\n'
              'from torch._utils import _flatten_dense_tensors\n'
              'from torch.nn.modules.batchnorm import _BatchNorm\n'
              'dist.distributed_c10d._get_default_store()\n'
              'torch.autograd.Variable._execution_engine\n'
              'x._private_of_our_own\n'
              'torch.nn.Module.__init__\n')
    lines = sorted(line for line, _ in private_torch_uses(source))
    assert lines == [3, 4, 5, 6]


def test_private_torch_calls_live_in_one_module():
    files = [
        f for pattern in ('mmddp_ext/**/*.py', 'projects/**/*.py')
        for f in glob.glob(osp.join(REPO, pattern), recursive=True)
    ]
    assert len(files) > 50
    outside = {}
    for path in files:
        relative = osp.relpath(path, REPO)
        with open(path) as f:
            uses = private_torch_uses(f.read())
        if uses and relative != OWNER:
            outside[relative] = uses
    assert not outside, (
        f'private torch interfaces outside {OWNER}: {outside}; add a '
        'function there (with what it reaches and why) and call it')
    with open(osp.join(REPO, OWNER)) as f:
        assert private_torch_uses(f.read())  # the owner is scanned too


def test_the_wrappers_reach_torch():
    """Each wrapper works on this torch (what a torch upgrade would break
    shows here first)."""
    tensors = [torch.arange(3.), torch.ones(2, 2)]
    flat = torch_private.flatten(tensors)
    assert flat.tolist() == [0., 1., 2., 1., 1., 1., 1.]
    assert [t.shape for t in torch_private.unflatten(flat, tensors)] == [
        t.shape for t in tensors
    ]
    assert issubclass(torch.nn.SyncBatchNorm, torch_private.BatchNormBase)
    assert issubclass(torch.nn.Dropout2d, torch_private.DropoutBase)
    if not dist.is_initialized():
        assert torch_private.default_store() is None
    calls = []
    weight = torch.ones(1, requires_grad=True)
    weight.register_hook(lambda grad: torch_private.queue_end_of_backward(
        lambda: calls.append('end')) or grad)
    (weight * 2).sum().backward()
    assert calls == ['end']
    version = torch_private.tensor_version(weight)
    with torch.no_grad():
        weight.add_(1)
    assert torch_private.tensor_version(weight) > version


@pytest.mark.parametrize('name', [
    'default_store', 'group_timeout', 'queue_end_of_backward',
    'ignore_in_ddp', 'reducer_params', 'flatten', 'unflatten',
    'tensor_version'
])
def test_every_wrapper_is_documented(name):
    assert (getattr(torch_private, name).__doc__ or '').strip()
