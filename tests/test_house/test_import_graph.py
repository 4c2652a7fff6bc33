"""The package's modules import one another without a cycle, counting the
imports inside functions too (a lazy import hides a cycle from the
interpreter, not from a reader)."""
import ast
import os
import os.path as osp
from typing import Dict, List, Set

from ..helpers import REPO_ROOT

PACKAGE = 'mmddp_ext'


def _module_name(path: str, top: str) -> str:
    relative = osp.relpath(path, top)[:-len('.py')].split(os.sep)
    if relative[-1] == '__init__':
        relative = relative[:-1]
    return '.'.join(relative)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ''
    parts = module.split('.')
    base = parts if is_package else parts[:-1]
    base = base[:len(base) - (node.level - 1)]
    return '.'.join(base + ([node.module] if node.module else []))


def import_graph(root: str = osp.join(REPO_ROOT,
                                      PACKAGE)) -> Dict[str, Set[str]]:
    """Module -> the package's modules it imports (a package counts as its
    ``__init__``; ``from package import name`` imports the submodule when
    one is so named)."""
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith('.py'):
                path = osp.join(folder, name)
                files[_module_name(path, osp.dirname(root))] = path
    graph: Dict[str, Set[str]] = {module: set() for module in files}
    for module, path in files.items():
        is_package = path.endswith('__init__.py')
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            targets: List[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_package, node)
                targets = [
                    f'{base}.{alias.name}'
                    if f'{base}.{alias.name}' in files else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in files:
                    target = target.rpartition('.')[0]
                if target and target != module:
                    graph[module].add(target)
    return graph


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """The strongly connected components of more than one module
    (Tarjan's algorithm)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    found: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _without_packages(graph):
    """Package ``__init__`` modules re-export their submodules; an import
    of a package by one of its own submodules' importers is not a cycle
    between the modules that do the work."""
    packages = {
        m
        for m in graph if osp.isdir(osp.join(REPO_ROOT, *m.split('.')))
    }
    return {
        m: {t
            for t in targets if t not in packages}
        for m, targets in graph.items() if m not in packages
    }


def test_no_import_cycle_in_the_package():
    assert cycles(_without_packages(import_graph())) == []


def test_the_check_finds_a_lazy_cycle(tmp_path):
    """The control: a cycle closed by an import inside a function."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / '__init__.py').write_text('')
    (package / 'a.py').write_text('from .b import thing\n')
    (package / 'b.py'
     ).write_text('def thing():\n    from .a import other\n    return other\n')
    assert cycles(import_graph(
        str(package))) == [[f'{PACKAGE}.a', f'{PACKAGE}.b']]
