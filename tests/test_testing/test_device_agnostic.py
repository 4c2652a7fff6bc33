"""A static guard against the faults a GPU run found in code that passed on
CPU ranks (issue 34): numpy on a tensor that may live on a GPU, parameters
made with the legacy ``torch.Tensor(...)`` constructor (it ignores a CUDA
default device, so a model built on a GPU rank keeps them on the CPU and
DDP refuses it), and a module moved to a device before its last part
exists. The scan reads every Python file of tests/, mmddp_ext/, projects/,
tools/ and benchmarks/; each rule is shown to flag a planted example (the
negative control) and to pass its fixed form.
"""
import ast
import os.path as osp
from pathlib import Path
from typing import List

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
SCANNED = ('tests', 'mmddp_ext', 'projects', 'tools', 'benchmarks')
LEGACY_CONSTRUCTORS = frozenset(
    ('Tensor', 'FloatTensor', 'DoubleTensor', 'HalfTensor', 'LongTensor',
     'IntTensor', 'BoolTensor', 'ByteTensor'))
MOVES = frozenset(('to', 'cuda', 'on_rank_device'))
ADDS_PART = frozenset(('register_buffer', 'register_parameter', 'add_module',
                       'register_module'))


def _is_cpu_call(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == 'cpu')


def numpy_off_host(nodes: List[ast.AST]) -> List[int]:
    """Lines with ``x.numpy()`` where ``x`` is not ``<...>.cpu()``."""
    return [
        node.lineno for node in nodes
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and node.func.attr == 'numpy' and not node.args
        and not _is_cpu_call(node.func.value)
    ]


def legacy_constructors(nodes: List[ast.AST]) -> List[int]:
    """Lines with ``torch.Tensor(...)`` and the typed legacy constructors
    called with arguments (``isinstance(x, torch.Tensor)`` is fine)."""
    return [
        node.lineno for node in nodes
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == 'torch'
        and node.func.attr in LEGACY_CONSTRUCTORS and node.args
    ]


def _moved_name(stmt: ast.stmt):
    """``m`` for ``m.to(...)``, ``m.cuda()``, ``m = m.to(...)``,
    ``m = on_rank_device(...)`` and the like; None otherwise."""
    value = stmt.value if isinstance(stmt, (ast.Expr, ast.Assign)) else None
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    while (isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call)
           and func.attr in ('train', 'eval')):  # m.to(d).train()
        func = func.value.func
    if isinstance(func, ast.Attribute) and func.attr in MOVES and isinstance(
            func.value, ast.Name):
        return func.value.id
    if isinstance(func, ast.Name) and func.id in MOVES and isinstance(
            stmt, ast.Assign) and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    return None


def _adds_part_to(stmt: ast.stmt, name: str) -> bool:
    """Whether ``stmt`` gives ``name`` a new parameter, buffer or module:
    ``name.x = <call>`` or ``name.register_buffer(...)`` and the like."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and isinstance(
                        target.value, ast.Name) and target.value.id == name:
                    return True
        if isinstance(node, ast.Call) and isinstance(
                node.func, ast.Attribute) and node.func.attr in ADDS_PART:
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == name:
                return True
    return False


def parts_added_after_move(nodes: List[ast.AST]) -> List[int]:
    """Lines that add a part to a module moved earlier in the same block."""
    lines = []
    for node in nodes:
        body = getattr(node, 'body', None)
        if not isinstance(body, list):
            continue
        moved = set()
        for stmt in body:
            for name in sorted(moved):
                if _adds_part_to(stmt, name):
                    lines.append(stmt.lineno)
            name = _moved_name(stmt)
            if name is not None:
                moved.add(name)
    return lines


RULES = {
    'numpy() on a tensor not moved to the host by .cpu() first':
    numpy_off_host,
    'legacy torch.Tensor(...) constructor (ignores the default device)':
    legacy_constructors,
    'a part added to a module after it was moved to its device':
    parts_added_after_move,
}


def _python_files():
    for top in SCANNED:
        yield from sorted(Path(REPO_ROOT, top).rglob('*.py'))


def scan(source: str) -> List[str]:
    nodes = list(ast.walk(ast.parse(source)))
    return [
        f'{line}: {rule}' for rule, find in RULES.items()
        for line in find(nodes)
    ]


def test_no_device_fault_in_the_repository():
    found = []
    for path in _python_files():
        for hit in scan(path.read_text()):
            found.append(f'{path.relative_to(REPO_ROOT)}:{hit}')
    assert found == [], '\n'.join(found)


@pytest.mark.parametrize('planted, fixed', [
    ('grads = param.grad.detach().numpy()',
     'grads = param.grad.detach().cpu().numpy()'),
    ('keep = boxes.numpy()', 'keep = boxes.cpu().numpy()'),
    ('embed = nn.Parameter(torch.Tensor(4, 8))',
     'embed = nn.Parameter(torch.empty(4, 8))'),
    ('def build():\n    model = Net()\n    model.to(device)\n'
     '    model.extra = nn.Linear(2, 2)\n    return model',
     'def build():\n    model = Net()\n    model.extra = nn.Linear(2, 2)\n'
     '    model.to(device)\n    return model'),
    ('def build():\n    model = on_rank_device(Net())\n'
     "    model.register_buffer('count', torch.zeros(1))\n    return model",
     "def build():\n    model = Net()\n    model.register_buffer('count', "
     'torch.zeros(1))\n    return on_rank_device(model)'),
],
                         ids=['detached-grad', 'boxes', 'legacy-ctor',
                              'part-after-to', 'buffer-after-move'])
def test_the_scan_flags_each_planted_fault(planted, fixed):
    """Negative control: each rule finds its fault where it was planted,
    and the fixed form passes."""
    assert len(scan(planted)) == 1, scan(planted)
    assert scan(fixed) == []
