"""The ``multi_rank`` marker: set on every test that starts ranks.

``pytest -m multi_rank --device cuda`` runs the tests whose ranks take the
device (``tools/selftest.sh``). Nobody has to remember the marker: at
collection, a test is marked when the code it runs reaches one of the
launchers (:func:`~mmddp_ext.testing.run_on_ranks`,
:func:`~mmddp_ext.testing.run_command`; ``tests.helpers.dist_train`` and
the DDP doctor's probe go through them). "Reaches" follows, from the test
function and the fixtures it uses (those a parametrised fixture names
through ``request.getfixturevalue`` included), every name its code loads
(globals, imports inside functions, attributes of the tests' and the
package's modules, classes and their methods) into the functions of
``tests`` and ``mmddp_ext``, transitively.

The reading errs on the side of marking: a path taken only for some
arguments counts (``run_doctor(cfg, dynamic=False)`` starts no ranks, yet
its tests are marked). A test that starts ranks as subprocesses of its own
(``tools/ddp_doctor.py`` run by ``subprocess``) carries the marker itself.
What the reading cannot see, each run checks: a test that started ranks
in its process without the marker fails (:func:`check_marked`).
"""
import functools
import importlib
import importlib.util
import inspect
import sys
import types
from typing import Iterable, Set

import pytest

MARKER = 'multi_rank'
MARKER_HELP = (f'{MARKER}: the test starts ranks (run_on_ranks, run_command, '
               'tools/dist_train.sh); set automatically (tests/'
               'multi_rank_marker.py), so `pytest -m multi_rank --device '
               'cuda` runs every test whose ranks use the device')
# Code of these packages is followed; anything else (torch, mmengine) is
# a leaf.
OWN_PACKAGES = ('tests', 'mmddp_ext')
LAUNCHER_MODULE = 'mmddp_ext.launch.rank_launcher'


def _launchers() -> Set[int]:
    """The launchers; none if no collected module loaded them (no test
    can reach one then)."""
    module = sys.modules.get(LAUNCHER_MODULE)
    if module is None:
        return set()
    return {id(module.run_on_ranks), id(module.run_command)}


def _own(obj) -> bool:
    module = getattr(obj, '__module__', None) or ''
    return module.split('.')[0] in OWN_PACKAGES


def _searched_module(module: types.ModuleType) -> bool:
    return module.__name__.split('.')[0] in OWN_PACKAGES


def _names(code: types.CodeType) -> Iterable[str]:
    """Every global, attribute and imported name ``code`` (and the code
    nested in it: lambdas, inner functions, comprehensions) loads."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


@functools.lru_cache(maxsize=None)
def _package_module(name: str):
    """``name``, a module of the package or of the tests not loaded yet,
    imported (so that the marks do not depend on which other files were
    collected); None for any other name."""
    if name.split('.')[0] not in OWN_PACKAGES:
        return None
    try:
        if importlib.util.find_spec(name) is None:
            return None
    except ImportError:  # a parent is a module, not a package
        return None
    return importlib.import_module(name)


def _imported_modules(names: Set[str], package: str):
    """The modules that import statements with these names may load (an
    import's module name is among the names its code loads): each name
    taken as absolute, and as relative to each package enclosing
    ``package`` (more modules than imported only widens the search)."""
    parts = package.split('.')
    for name in names | {''}:
        candidates = [name] + [
            '.'.join(parts[:depth] + ([name] if name else []))
            for depth in range(len(parts), 0, -1)
        ]
        for candidate in candidates:
            module = sys.modules.get(candidate) or _package_module(candidate)
            if module is not None:
                yield module


class _Reach:
    """Memoised: does an object's code reach a launcher?"""

    def __init__(self):
        self.launchers = _launchers()
        self.done = {}

    def __call__(self, obj) -> bool:
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if id(obj) in self.launchers:
            return True
        key = id(obj)
        if key in self.done:
            return self.done[key]
        self.done[key] = False  # cycles end here
        self.done[key] = found = self._search(obj)
        return found

    def _search(self, obj) -> bool:
        if isinstance(obj, type):
            return _own(obj) and any(
                self(value) for value in vars(obj).values()
                if isinstance(value, (types.FunctionType, staticmethod,
                                      classmethod, property)))
        if isinstance(obj, (staticmethod, classmethod)):
            return self(obj.__func__)
        if isinstance(obj, property):
            return any(self(f) for f in (obj.fget, obj.fset) if f)
        if isinstance(obj, types.MethodType):
            return self(obj.__func__)
        if not isinstance(obj, types.FunctionType) or not _own(obj):
            return False
        return self._code_reaches(obj.__code__, obj.__globals__,
                                  obj.__module__)

    def _code_reaches(self, code, namespace, module_name) -> bool:
        names = set(_names(code))
        package = module_name.rpartition('.')[0]
        modules = list(_imported_modules(names, package))
        values = [namespace[n] for n in names if n in namespace]
        modules += [v for v in values if isinstance(v, types.ModuleType)]
        for module in filter(_searched_module, modules):
            values += [
                getattr(module, n) for n in names if hasattr(module, n)
            ]
        return any(
            self(value) for value in values
            if not isinstance(value, types.ModuleType))


def _fixture_functions(item):
    """The functions of every fixture ``item`` uses, those that a
    parametrised fixture names with ``request.getfixturevalue`` included."""
    info = getattr(item, '_fixtureinfo', None)
    names = set(getattr(item, 'fixturenames', ()))
    callspec = getattr(item, 'callspec', None)
    if callspec is not None:
        names |= {
            v for v in callspec.params.values() if isinstance(v, str)
        }
    manager = item.session._fixturemanager
    for name in names:
        defs = None
        if info is not None:
            defs = info.name2fixturedefs.get(name)
        if defs is None:
            try:
                defs = manager.getfixturedefs(name, item)
            except Exception:  # not a fixture name (a plain parameter)
                defs = None
        for fixturedef in defs or ():
            yield fixturedef.func


def starts_ranks(item, reach=None) -> bool:
    """Whether ``item``'s test function or fixtures reach a launcher."""
    reach = reach or _Reach()
    function = getattr(item, 'function', None)
    return any(
        reach(f) for f in [function, *_fixture_functions(item)] if f)


def mark_multi_rank(items) -> None:
    """Add the marker to every item that :func:`starts_ranks`."""
    reach = _Reach()
    for item in items:
        if starts_ranks(item, reach):
            item.add_marker(MARKER)


def launches() -> int:
    """How many rank launches this process has started so far."""
    module = sys.modules.get(LAUNCHER_MODULE)
    return 0 if module is None else module.launch_count()


def check_marked(item, launched: int) -> None:
    """Fail ``item`` if it started ranks (``launched`` launches) without
    the marker: ``pytest -m multi_rank`` would leave it out."""
    if launched and item.get_closest_marker(MARKER) is None:
        pytest.fail(
            f'{item.nodeid} started ranks ({launched} launch(es)) but is '
            f'not marked {MARKER}: tests/multi_rank_marker.py did not see '
            'the launcher in its code (reached through a value decided at '
            f'run time?). Add `pytestmark = pytest.mark.{MARKER}` to its '
            'module, or call the launcher where the test or a fixture '
            'names it.', pytrace=False)
