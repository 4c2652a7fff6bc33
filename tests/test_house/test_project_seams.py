"""The projects under ``projects/`` that build on one another say so, and
reach one another only through each package's face.

The chain is D-FINE on RT-DETR, DEIM on D-FINE and RT-DETR, DEIMv2 on all
three; CO-DETR and RT-DETR stand alone. MMDetection's projects are
independent; ours are not, so for every project (README.md, configs/ and
one package, ``projects.<Name>.<package>`` on the import path):

- its README.md has a ``Requires:`` line that lists the projects it builds
  on, ``Requires: projects/RT-DETR (rtdetr)``, or says ``Requires:
  nothing beyond mmddp_ext``; it lists none that it does not use, and the
  projects do not require one another in a circle;
- one module of its package, ``ports.py``, imports those packages by their
  dotted names (``import_module`` where the project directory has a
  hyphen), never one of their internal modules, and takes only the names
  a package's ``__init__`` exports (its ``__all__``);
- its configs import (``custom_imports``) and inherit (``_base_``) only
  from itself and the projects it requires.

:func:`seam_offences` reads the sources (ast) and imports nothing; the
negative cases plant each offence in a tmp tree and see it flagged.
"""
import ast
import glob
import os
import os.path as osp
import re
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from ..helpers import REPO_ROOT
from .test_import_graph import cycles

PROJECTS = osp.join(REPO_ROOT, 'projects')
PORTS = 'ports.py'
NOTHING = 'nothing beyond mmddp_ext'
REQUIRES = re.compile(r'^Requires:(.*)$', re.MULTILINE)
REQUIRED = re.compile(r'projects/([^\s/()]+) \((\w+)\)')
IMPORTERS = ('import_module', '__import__')
UNLISTED = "README.md's Requires line does not list"
# package -> the names its __init__ exports (__all__)
Faces = Dict[str, Set[str]]
# The chain as the READMEs state it (package -> the packages it requires).
CHAIN = {
    'projects.CO-DETR.codetr': set(),
    'projects.RT-DETR.rtdetr': set(),
    'projects.D-FINE.dfine': {'projects.RT-DETR.rtdetr'},
    'projects.DEIM.deim': {'projects.D-FINE.dfine', 'projects.RT-DETR.rtdetr'},
    'projects.DEIMv2.deimv2':
    {'projects.DEIM.deim', 'projects.D-FINE.dfine', 'projects.RT-DETR.rtdetr'},
}


def _parse(path: str) -> ast.AST:
    with open(path) as f:
        return ast.parse(f.read(), path)


def _exports(init: str) -> Set[str]:
    """The names in a package ``__init__``'s ``__all__`` (none without)."""
    for node in _parse(init).body:
        if (isinstance(node, ast.Assign) and any(
                getattr(target, 'id', None) == '__all__'
                for target in node.targets)):
            return set(ast.literal_eval(node.value))
    return set()


def packages(root: str) -> Dict[str, Tuple[str, str]]:
    """``{'projects.<Name>.<package>': (project folder, package folder)}``
    for every project package below ``root``."""
    found = {}
    for init in sorted(glob.glob(osp.join(root, '*', '*', '__init__.py'))):
        package = osp.dirname(init)
        project = osp.dirname(package)
        name = '.'.join(
            ['projects',
             osp.basename(project),
             osp.basename(package)])
        found[name] = (project, package)
    return found


def read_requires(readme: str) -> Optional[Set[str]]:
    """The packages a README's ``Requires:`` line lists; None when it has
    no such line, or one that lists no project and does not say
    ``nothing beyond mmddp_ext``."""
    if not osp.isfile(readme):
        return None
    with open(readme) as f:
        match = REQUIRES.search(f.read())
    if match is None:
        return None
    listed = {
        f'projects.{name}.{package}'
        for name, package in REQUIRED.findall(match.group(1))
    }
    if not listed and NOTHING not in match.group(1):
        return None
    return listed


def _imported_module(call: ast.Call) -> Optional[str]:
    """The module an ``import_module``/``__import__`` call names (its
    first argument), ``'<computed>'`` when that is not a literal."""
    func = call.func
    if getattr(func, 'attr', getattr(func, 'id', None)) not in IMPORTERS:
        return None
    if call.args and isinstance(call.args[0], ast.Constant):
        return call.args[0].value
    return '<computed>'


def project_takes(path: str,
                  known: Set[str]) -> Iterator[Tuple[int, str, Optional[str]]]:
    """``(line, module, name)`` for every name a source file takes from a
    ``projects.`` module; ``name`` is None for the import of the module
    itself. ``known`` holds the package names, so that ``from
    projects.<Name> import <package>`` counts as an import of the
    package."""
    tree = _parse(path)
    bound: Dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith('projects.'):
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    yield node.lineno, alias.name, None
        elif (isinstance(node, ast.ImportFrom) and not node.level
              and (node.module or '').startswith('projects.')):
            for alias in node.names:
                submodule = f'{node.module}.{alias.name}'
                if submodule in known:
                    bound[alias.asname or alias.name] = submodule
                    yield node.lineno, submodule, None
                else:
                    yield node.lineno, node.module, alias.name
        elif isinstance(node, ast.Call):
            module = _imported_module(node)
            if module is not None and (module == '<computed>'
                                       or module.startswith('projects.')):
                yield node.lineno, module, None
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            module = _imported_module(node.value) or ''
            for target in node.targets:
                if module.startswith('projects.') and isinstance(
                        target, ast.Name):
                    bound[target.id] = module
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in bound):
            yield node.lineno, bound[node.value.id], node.attr


def config_uses(path: str, project_folders: Dict[str, str]) -> Set[str]:
    """The project packages a config names: the ``projects.`` modules of
    its ``custom_imports`` and the projects its ``_base_`` files (any
    relative ``.py`` path in it) lie in. ``project_folders`` maps each
    project folder to its package."""
    used = set()
    for node in ast.walk(_parse(path)):
        if not (isinstance(node, ast.Constant)
                and isinstance(node.value, str)):
            continue
        if node.value.startswith('projects.'):
            used.add(node.value)
        elif node.value.endswith('.py') and not osp.isabs(node.value):
            target = osp.normpath(osp.join(osp.dirname(path), node.value))
            for folder, package in project_folders.items():
                if target.startswith(folder + os.sep):
                    used.add(package)
    return used


def _offences_of_source(path: str, own: str, requires: Optional[Set[str]],
                        faces: Faces, used: Set[str]) -> List[str]:
    """What a package source file does wrong across the seam, each
    offence once, at its first line; adds the packages it takes names
    from to ``used``."""
    found: Dict[Tuple[str, str], str] = {}
    for line, module, name in project_takes(path, set(faces)):
        if module == own or module.startswith(own + '.'):
            continue
        if module not in faces:
            found.setdefault(
                ('internal', module),
                f'line {line}: imports {module!r}, which is not a project '
                "package (another project's internal module, or a computed "
                'name)')
            continue
        used.add(module)
        if osp.basename(path) != PORTS:
            found.setdefault(('outside', module),
                             f'line {line}: imports {module!r} outside '
                             f'{PORTS}, the one module that may')
        if requires is not None and module not in requires:
            found.setdefault(
                ('unlisted', module),
                f'line {line}: takes from {module!r}, which ' + UNLISTED)
        if name is not None and name not in faces[module]:
            found.setdefault(('unexported', f'{module}.{name}'),
                             f'line {line}: takes {name!r} from {module!r}, '
                             'which its __all__ does not export')
    return list(found.values())


def _offences_of_config(path: str, own: str, requires: Optional[Set[str]],
                        faces: Faces, folders: Dict[str, str],
                        used: Set[str]) -> List[str]:
    """What a config of project ``own`` imports or inherits from a
    project that its README does not list; adds the packages it uses to
    ``used``."""
    found = []
    for name in sorted(config_uses(path, folders) - {own}):
        if name not in faces:
            found.append(f'uses {name!r}, which is not a project package')
            continue
        used.add(name)
        if requires is not None and name not in requires:
            found.append(f'uses {name!r}, which ' + UNLISTED)
    return found


def _offences_of_readme(requires: Optional[Set[str]], faces: Faces,
                        used: Set[str]) -> List[str]:
    """What a README's ``Requires:`` line gets wrong, given the packages
    the project's sources and configs use."""
    if requires is None:
        return [
            "no valid 'Requires:' line: list each project it builds on as "
            f"'projects/<Name> (<package>)', or write 'Requires: {NOTHING}'"
        ]
    return [
        f'Requires lists {name!r}, which ' +
        ('no module or config of this project uses'
         if name in faces else 'is not a project package')
        for name in sorted(requires - used)
    ]


def seam_offences(root: str = PROJECTS) -> Dict[str, List[str]]:
    """Every offence against the seams between the projects below
    ``root``, per file (its path relative to ``root``): a README without
    a valid ``Requires:`` line or listing a project it does not use; a
    package file that imports another project outside ``ports.py``, an
    internal module of one, a project the README does not list or a name
    its ``__all__`` does not export; a config that imports or inherits
    from a project the README does not list; projects that require one
    another in a circle."""
    found_packages = packages(root)
    faces = {
        name: _exports(osp.join(package, '__init__.py'))
        for name, (_, package) in found_packages.items()
    }
    folders = {project: name for name, (project, _) in found_packages.items()}
    offences: Dict[str, List[str]] = {}
    graph: Dict[str, Set[str]] = {}
    for own, (project, package) in found_packages.items():
        readme = osp.join(project, 'README.md')
        requires = read_requires(readme)
        graph[own] = set(requires or ()) & set(faces)
        used: Set[str] = set()
        for path in _python_files(package):
            offences[path] = _offences_of_source(path, own, requires, faces,
                                                 used)
        for path in _python_files(osp.join(project, 'configs')):
            offences[path] = _offences_of_config(path, own, requires, faces,
                                                 folders, used)
        offences[readme] = _offences_of_readme(requires, faces, used)
    offences[osp.join(root, 'README.md')] = [
        f'projects require one another in a circle: {circle}'
        for circle in cycles(graph)
    ]
    return {
        osp.relpath(path, root): found
        for path, found in offences.items() if found
    }


def _python_files(folder: str) -> List[str]:
    return sorted(glob.glob(osp.join(folder, '**', '*.py'), recursive=True))


def requires_graph(root: str = PROJECTS) -> Dict[str, Set[str]]:
    """Package -> the packages its project's README requires."""
    return {
        name: read_requires(osp.join(project, 'README.md'))
        for name, (project, _) in packages(root).items()
    }


def test_projects_keep_to_their_seams():
    assert seam_offences() == {}


def test_the_chain_is_what_the_readmes_say():
    """The dependency chain, stated once here and once per README (the
    scan above keeps the READMEs true to the code)."""
    assert requires_graph() == CHAIN


PORTS_SOURCE = ('from importlib import import_module\n'
                "_up = import_module('projects.Up-Stream.upstream')\n"
                'Base = _up.Base\n')
DOWN_MODEL = ('from importlib import import_module\n\n'
              'from .ports import Base\n\n'
              "_math = import_module('math')\n"
              'TAU = _math.tau\n')
DOWN_CONFIG = ("_base_ = ['../../Up-Stream/configs/_base_/model.py']\n"
               "custom_imports = dict(imports=['mmddp_ext', "
               "'projects.Up-Stream.upstream', 'projects.Down.down'])\n")
# Two projects: Up-Stream (package ``upstream``) stands alone, Down
# (package ``down``) builds on it through ``down/ports.py``.
TREE = {
    'Up-Stream/README.md': f'# Up\n\nRequires: {NOTHING}.\n',
    'Up-Stream/upstream/__init__.py': "__all__ = ['Base', 'helper']\n",
    'Up-Stream/upstream/layers.py': 'Hidden = None\n',
    'Up-Stream/configs/_base_/model.py': "model = dict(type='Base')\n",
    'Down/README.md': '# Down\n\nRequires: projects/Up-Stream (upstream).\n',
    'Down/down/__init__.py': "from .model import TAU\n__all__ = ['TAU']\n",
    'Down/down/ports.py': PORTS_SOURCE,
    'Down/down/model.py': DOWN_MODEL,
    'Down/configs/down.py': DOWN_CONFIG,
}


def _tree(root) -> None:
    """Write :data:`TREE` below ``root``."""
    for relative, text in TREE.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_planted_tree_passes(tmp_path):
    _tree(tmp_path)
    assert seam_offences(str(tmp_path)) == {}
    assert requires_graph(str(tmp_path)) == {
        'projects.Up-Stream.upstream': set(),
        'projects.Down.down': {'projects.Up-Stream.upstream'}
    }


PORTS_FILE = osp.join('Down', 'down', 'ports.py')
DOWN_README = osp.join('Down', 'README.md')


@pytest.mark.parametrize(
    'relative, text, expected',
    [
        # a project that uses another its README does not list
        ('Down/README.md', f'# Down\n\nRequires: {NOTHING}.\n', {
            PORTS_FILE: [
                "line 2: takes from 'projects.Up-Stream.upstream', which " +
                UNLISTED
            ],
            osp.join('Down', 'configs', 'down.py'):
            ["uses 'projects.Up-Stream.upstream', which " + UNLISTED],
        }),
        # a name the other project's __all__ does not export
        ('Down/down/ports.py', PORTS_SOURCE + 'Hidden = _up.Hidden\n', {
            PORTS_FILE: [
                "line 4: takes 'Hidden' from 'projects.Up-Stream.upstream',"
                ' which its __all__ does not export'
            ]
        }),
        # a reach into another project's internal module
        ('Down/down/ports.py', PORTS_SOURCE +
         "_layers = import_module('projects.Up-Stream.upstream.layers')\n", {
             PORTS_FILE: [
                 "line 4: imports 'projects.Up-Stream.upstream.layers', "
                 'which is not a project package (another project\'s '
                 'internal module, or a computed name)'
             ]
         }),
        # another project imported outside ports.py
        ('Down/down/model.py', PORTS_SOURCE, {
            osp.join('Down', 'down', 'model.py'): [
                "line 2: imports 'projects.Up-Stream.upstream' outside "
                'ports.py, the one module that may'
            ]
        }),
        # no Requires line at all
        ('Down/README.md', '# Down\n', {
            DOWN_README: [
                "no valid 'Requires:' line: list each project it builds "
                "on as 'projects/<Name> (<package>)', or write 'Requires: "
                f"{NOTHING}'"
            ]
        }),
        # a Requires line that lists a project nothing uses
        ('Up-Stream/README.md', '# Up\n\nRequires: projects/Down (down).\n', {
            osp.join('Up-Stream', 'README.md'): [
                "Requires lists 'projects.Down.down', which no module or "
                'config of this project uses'
            ],
            'README.md': [
                'projects require one another in a circle: '
                "['projects.Down.down', 'projects.Up-Stream.upstream']"
            ]
        }),
        # a config that imports a project the README does not list
        ('Up-Stream/configs/up.py',
         "custom_imports = dict(imports=['projects.Down.down'])\n", {
             osp.join('Up-Stream', 'configs', 'up.py'):
             ["uses 'projects.Down.down', which " + UNLISTED]
         }),
    ])
def test_the_scan_flags_each_planted_offence(tmp_path, relative, text,
                                             expected):
    """Negative cases: each planted offence is flagged, and nothing
    else."""
    _tree(tmp_path)
    (tmp_path / relative).write_text(text)
    assert seam_offences(str(tmp_path)) == expected


def test_the_scan_follows_plain_imports(tmp_path):
    """A project without a hyphen is imported with a plain ``from ...
    import``: an unexported name and an unlisted project are flagged
    there too."""
    _tree(tmp_path)
    (tmp_path / 'Up-Stream').rename(tmp_path / 'Up')
    (tmp_path / 'Down' /
     'README.md').write_text('# Down\n\nRequires: projects/Up (upstream).\n')
    (tmp_path / 'Down' / 'configs' / 'down.py').write_text('')
    ports = tmp_path / 'Down' / 'down' / 'ports.py'
    ports.write_text('from projects.Up.upstream import Base\n')
    assert seam_offences(str(tmp_path)) == {}
    ports.write_text('from projects.Up.upstream import Base, Hidden\n'
                     'from projects.Down.other import Thing\n')
    assert seam_offences(str(tmp_path)) == {
        PORTS_FILE: [
            "line 1: takes 'Hidden' from 'projects.Up.upstream', which its "
            '__all__ does not export',
            "line 2: imports 'projects.Down.other', which is not a project "
            "package (another project's internal module, or a computed "
            'name)'
        ]
    }
