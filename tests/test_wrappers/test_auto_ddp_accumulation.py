"""With gradient accumulation, AutoDDP counts a parameter as always used
only if every micro-step used it, and checks usage per backward (issue
14, case 6), on 2 real gloo ranks."""
from mmddp_ext.testing import run_on_ranks
from mmddp_ext.wrappers import AutoDDP

from .auto_ddp_tiny import train_tiny


class ProbeCountsAnyMicroStep(AutoDDP):
    """The probe before the fix: used in some micro-step counts as used."""

    def _record_probe_usage(self, used):
        super()._record_probe_usage(used)
        self._probe_always = list(self._probe_ever)


class UsageFromAccumulatedGrads(ProbeCountsAnyMicroStep):
    """Before the fix in full: usage read from ``.grad``, which holds the
    gradients of every micro-step since the last step."""

    def _used_in_backward(self, params):
        return [p.grad is not None for _, p in params]


def _scenarios():
    # 'extra' is used in the no_sync micro-steps only.
    return [
        train_tiny(
            'nosync_micro_steps', 6, wrapper_cls=cls, accumulative_counts=2)
        for cls in (AutoDDP, ProbeCountsAnyMicroStep,
                    UsageFromAccumulatedGrads)
    ]


def test_parameter_used_in_no_sync_micro_steps_only():
    results = run_on_ranks(_scenarios, 2, timeout=90)
    for fixed, any_micro_step, stock in results:
        assert fixed['error'] is None and fixed['iters_done'] == 6
        assert fixed['decision']['mode'] == 'find_unused'
        assert fixed['decision']['partially_used'] == ['extra']
        assert fixed['find_unused'] is True
        assert fixed['extra'].item() != 1.0  # it trains
        # Probe fixed but counting any micro-step: the per-backward check
        # stops every rank in the first synchronising step after the probe.
        assert any_micro_step['decision']['mode'] == 'static'
        assert any_micro_step['iters_done'] == 3
        assert any_micro_step['error'].startswith(
            'UnexpectedUnusedParameterError: AutoDDP (ranks 0, 1): 1 '
            'parameter(s) received no gradient in this iteration')
        # Negative control, neither mechanism: what users saw.
        assert stock['decision']['mode'] == 'static'
        assert 'Expected to have finished reduction' in stock['error']
    assert results[0][1]['error'] == results[1][1]['error']
