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


def _privates_of(*objects) -> frozenset:
    return frozenset(n for obj in objects for n in dir(obj) if _private(n))


def _torch_objects() -> tuple:
    """Torch classes, and instances where members are set in
    ``__init__`` (a module's ``_modules``, an optimizer's hooks)."""
    param = torch.nn.Parameter(torch.zeros(1))
    return (torch.Tensor, param, torch.nn.Linear(1, 1),
            torch.nn.parallel.DistributedDataParallel, dist.ProcessGroup,
            dist.HashStore(), torch.optim.SGD([param], lr=0.1),
            torch.amp.GradScaler('cpu'), torch.Generator())


# Private members of the torch objects a module holds in a variable
# (tensors, parameters, modules, process groups, stores, DDP, optimizers,
# scalers, generators) rather than imports: ``self.up._version`` has no
# torch name at its root. Read from the installed torch, so a new private
# member is caught too; ``_C`` is torch's C extension wherever it hangs.
# ``_abc_impl`` is Python's ABC machinery, not torch's.
OBJECT_PRIVATES = _privates_of(*_torch_objects()) - {'_abc_impl'} | {'_C'}


def _own(receiver: ast.AST) -> bool:
    """``self._x``, ``cls._x`` or ``super()._x``: an object's own member,
    or an override calling the method it overrides (``_apply`` of a hook,
    ``_load_from_state_dict``), which may share a torch name."""
    return (isinstance(receiver, ast.Name) and receiver.id in ('self', 'cls')
            or isinstance(receiver, ast.Call) and isinstance(
                receiver.func, ast.Name) and receiver.func.id == 'super')


def private_torch_uses(source: str,
                       object_privates: frozenset = OBJECT_PRIVATES) -> list:
    """``from torch... import _x``, ``<torch alias>...._x`` and
    ``<any object>._x`` for ``_x`` in ``object_privates`` in ``source``,
    as ``(line, text)``."""
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
            if (isinstance(root, ast.Name) and root.id in aliases
                    or node.attr in object_privates and not _own(node.value)):
                found.append((node.lineno, ast.unparse(node)))
    return found


# The reads of projects/D-FINE/dfine/dfine_decoder_layers.py (up to
# commit 8b52e00) of its buffers' version counters, and the other forms.
LEAKS = ('key = (self.up._version, self.reg_scale._version)\n'
         'torch_module = torch.nn\n'
         'torch_module.functional._C\n'
         'group._get_sequence_number_for_group()\n'
         'param._post_accumulate_grad_hooks.clear()\n'
         'model._modules\n')
OWN = ('self._version = 2\n'
       'self._apply(runner)\n'
       'super()._load_from_state_dict(state, prefix)\n'
       'cache._entries\n')


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


def test_the_scan_finds_private_members_of_torch_objects():
    found = private_torch_uses(LEAKS)
    assert sorted(line for line, _ in found) == [1, 1, 3, 4, 5, 6], found
    assert private_torch_uses(OWN) == []


def test_control_the_import_only_scan_missed_the_leak():
    """Negative control: the guard as it was (torch names at the root
    only) passed the D-FINE line and every other form above."""
    assert private_torch_uses(LEAKS, object_privates=frozenset()) == []


def test_private_torch_calls_live_in_one_module():
    files = [
        f for folder in ('mmddp_ext', 'projects', 'tools', 'benchmarks')
        for f in glob.glob(
            osp.join(REPO, folder, '**', '*.py'), recursive=True)
    ]
    assert len(files) > 50
    folders = {osp.relpath(f, REPO).split(osp.sep)[0] for f in files}
    assert folders == {'mmddp_ext', 'projects', 'tools', 'benchmarks'}
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
    ran = []
    weight.register_post_accumulate_grad_hook(lambda p: ran.append(1))
    hooks = torch_private.post_accumulate_grad_hooks(weight)
    saved = dict(hooks)
    hooks.clear()
    (weight * 2).sum().backward()
    hooks.update(saved)
    (weight * 2).sum().backward()
    assert len(saved) == 1 and ran == [1]


def test_cached_until_written_remakes_after_a_write_or_a_new_tensor():
    """One entry per slot, reused until a source tensor is written in
    place or replaced."""
    owner = torch.nn.Module()
    owner.register_buffer('scale', torch.ones(2))
    made = []

    def get():
        return torch_private.cached_until_written(
            owner, '_cache', (owner.scale, None),
            lambda: made.append(1) or owner.scale * 2)

    first = get()
    assert get() is first and len(made) == 1
    with torch.no_grad():
        owner.scale.add_(1)
    assert get().tolist() == [4., 4.] and len(made) == 2
    owner.load_state_dict({'scale': torch.zeros(2)})
    assert get().tolist() == [0., 0.] and len(made) == 3
    owner.scale = torch.full((2, ), 5.)
    assert get().tolist() == [10., 10.] and len(made) == 4
    assert '_cache' not in owner.state_dict()
    with torch.inference_mode():
        fresh = torch.ones(1)
    torch_private.cached_until_written(owner, '_other', (fresh, ),
                                       lambda: made.append(1))
    torch_private.cached_until_written(owner, '_other', (fresh, ),
                                       lambda: made.append(1))
    assert len(made) == 6  # no version counter: made every time


@pytest.mark.parametrize('name', [
    'default_store', 'group_timeout', 'queue_end_of_backward', 'ignore_in_ddp',
    'reducer_params', 'flatten', 'unflatten', 'tensor_version',
    'cached_until_written', 'collective_sequence_number',
    'post_accumulate_grad_hooks'
])
def test_every_wrapper_is_documented(name):
    assert (getattr(torch_private, name).__doc__ or '').strip()
