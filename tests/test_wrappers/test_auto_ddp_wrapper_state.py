"""Hooks registered on the AutoDDP wrapper survive the DDP build, and a
left-out parameter that wakes up is logged once, then periodically
(issue 14, case 10), on 2 real gloo ranks."""
from mmengine.model import MMDistributedDataParallel

from mmddp_ext.testing import run_on_ranks
from mmddp_ext.wrappers import AutoDDP

from .auto_ddp_tiny import train_tiny

ITERS = 6
WOKE = 'AutoDDP: parameters left out of DDP received gradients'


class LogsEveryIteration(AutoDDP):
    """The logging before the fix."""

    woke_log_every = 1


class ResetsModuleState(AutoDDP):
    """The build before the fix: ``DistributedDataParallel.__init__`` on
    the live wrapper, which starts with ``nn.Module.__init__``."""

    def _init_ddp(self, find_unused):
        MMDistributedDataParallel.__init__(
            self,
            self.module,
            detect_anomalous_params=self.detect_anomalous_params,
            find_unused_parameters=find_unused,
            **self._ddp_kwargs)
        self._ddp_built = True


def _scenarios():
    # 'extra' is unused in the probe (left out of DDP), used from then on.
    return [
        train_tiny('from_call_2', ITERS, wrapper_cls=cls)
        for cls in (AutoDDP, LogsEveryIteration, ResetsModuleState)
    ]


def test_wrapper_hooks_kept_and_woken_parameter_logged_once():
    results = run_on_ranks(_scenarios, 2, timeout=90)
    extras = []
    for fixed, every_iteration, reset in results:
        for result in (fixed, every_iteration, reset):
            assert result['error'] is None
            assert result['decision']['ignored'] == ['extra']
        # The hook registered on the wrapper ran in every step, probe
        # included; the negative control lost it when DDP was built.
        assert fixed['wrapper_hook_calls'] == ITERS
        assert reset['wrapper_hook_calls'] == 1
        woke = [m for m in fixed['log'] if m.startswith(WOKE)]
        assert len(woke) == 1, fixed['log']
        assert ('extra (1 iteration(s) so far; logged again every 100 '
                'such iterations)') in woke[0]
        assert len([m for m in every_iteration['log']
                    if m.startswith(WOKE)]) == ITERS - 1
        extras.append(fixed['extra'])
    # Its gradient was averaged on the spot: the replicas agree.
    assert extras[0].item() != 1.0 and extras[0].equal(extras[1])
