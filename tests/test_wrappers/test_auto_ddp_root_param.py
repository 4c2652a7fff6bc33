"""AutoDDP leaves a never-used parameter on the model root out of DDP under
the names DDP itself uses, and checks DDP's reducer by identity (issue
14, case 4), on 2 real gloo ranks."""
from mmddp_ext.testing import run_on_ranks
from mmddp_ext.wrappers import AutoDDP
from mmddp_ext.wrappers.auto_ddp import ddp_ignore_names

from .auto_ddp_tiny import train_tiny


class NamedParametersNamesOnly(AutoDDP):
    """The naming before the fix: ``named_parameters()`` keys only
    (``'extra'``), while DDP's reducer looks for ``'.extra'``."""

    def _leave_out_of_ddp(self, params):
        ids = {id(p) for p in params}
        names = [n for n, p in self.module.named_parameters() if id(p) in ids]
        type(self).__mro__[2]._set_params_and_buffers_to_ignore_for_model(
            self.module, names)


class NoReducerCheck(NamedParametersNamesOnly):
    """The naming before the fix, and no check of the reducer."""

    def _check_left_out(self):
        pass


def _scenarios():
    return [
        train_tiny('never', 4),
        train_tiny('never', 4, NamedParametersNamesOnly),
        train_tiny('never', 4, NoReducerCheck),
    ]


def test_root_parameter_left_out_under_ddp_keys():
    results = run_on_ranks(_scenarios, 2, timeout=90)
    for fixed, unchecked_names, stock in results:
        # Fixed: left out of the reducer, trains on the fast path.
        assert fixed['error'] is None and fixed['iters_done'] == 4
        assert fixed['decision']['mode'] == 'ignore_unused'
        assert fixed['decision']['ignored'] == ['extra']
        assert fixed['find_unused'] is False
        assert fixed['reducer_has_extra'] is False
        assert fixed['extra'].item() == 1.0  # never touched
        # Names DDP does not use: the reducer check stops the run at the
        # build, on every rank, naming the parameter.
        assert unchecked_names['iters_done'] == 0
        assert unchecked_names['error'].startswith(
            'IgnoredParameterLeakError: AutoDDP: extra received no '
            'gradient in the probe step and were to be left out of DDP, '
            "but DDP's reducer still holds them")
        # Negative control, neither mechanism: what users saw.
        assert stock['iters_done'] == 2, stock['error']
        assert 'Expected to have finished reduction' in stock['error']
    assert results[0][1]['error'] == results[1][1]['error']


def test_ddp_ignore_names_cover_root_and_shared_parameters():
    import torch.nn as nn
    model = nn.Module()
    model.extra = nn.Parameter(nn.init.zeros_(nn.Linear(1, 1).weight))
    model.a = nn.Linear(2, 2)
    model.b = nn.Linear(2, 2)
    model.b.weight = model.a.weight  # shared: DDP keys it under both
    names = ddp_ignore_names(model, [model.extra, model.a.weight])
    assert names == ['.extra', 'a.weight', 'b.weight', 'extra']
