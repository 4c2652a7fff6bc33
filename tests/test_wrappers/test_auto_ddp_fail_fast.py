"""A parameter that goes unused on one rank after the probe stops EVERY
rank with the same error, through the side channel, in plain processes
that no launcher kills (issue 14, case 5), on 2 real gloo ranks."""
import datetime

from mmddp_ext.testing import run_on_ranks
from mmddp_ext.wrappers import AutoDDP

from .auto_ddp_tiny import train_tiny

# The collective timeout of these runs: a rank that waits for a peer
# instead of raising shows up as a timeout after this long.
GROUP_TIMEOUT_S = 10


class LocalCheckOnly(AutoDDP):
    """The check before the fix: each rank looks at its own usage only."""

    def _build_ddp(self):
        super()._build_ddp()
        self._side = None


def _train_in_own_group(wrapper_cls=None):
    """Like torchrun's ranks: each process sets up its own group (with a
    short collective timeout) and nothing kills it when a peer fails."""
    import torch.distributed as dist
    dist.init_process_group(
        'gloo', timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    return train_tiny('not_on_rank1_from_3', 5, wrapper_cls)


def test_every_rank_raises_the_same_error_at_once():
    # Every rank returns its own outcome (the function never raises), so
    # run_on_ranks never kills a peer: each error was raised by that rank.
    results = run_on_ranks(
        _train_in_own_group, 2, init_group=False, timeout=60)
    for result in results:
        assert result['decision']['mode'] == 'static'
        assert result['iters_done'] == 2
        assert result['error'].startswith(
            'UnexpectedUnusedParameterError: AutoDDP (rank 1): 1 '
            'parameter(s) received no gradient in this iteration')
        assert 'extra. Every rank stops here' in result['error']
        # Raised by the check, not after waiting for the timeout.
        assert result['seconds'] < GROUP_TIMEOUT_S
    assert results[0]['error'] == results[1]['error']


def test_without_the_side_channel_the_healthy_rank_waits_for_the_timeout():
    """Negative control: only rank 1 stops; rank 0 waits in DDP's
    finalisation for rank 1's gradient until the collective timeout."""
    results = run_on_ranks(
        _train_in_own_group,
        2,
        args=(LocalCheckOnly, ),
        init_group=False,
        timeout=60)
    healthy, failing = results
    assert failing['error'].startswith(
        'UnexpectedUnusedParameterError: AutoDDP (rank 1)')
    assert 'UnexpectedUnusedParameterError' not in healthy['error']
    assert healthy['seconds'] >= GROUP_TIMEOUT_S * 0.9, healthy['error']
