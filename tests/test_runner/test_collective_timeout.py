"""A hang we did not foresee becomes a clear error within the bounded
collective timeout, naming every rank's last iteration and phase."""
import time

import pytest
from mmengine.hooks import Hook

from mmddp_ext.testing import MultiRankError, run_on_ranks

from ..helpers import build_runner


class _StallRank1(Hook):
    """Rank 1 stops responding before its second iteration."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.rank == 1 and runner.iter == 1:
            time.sleep(45)


def _train_with_stall(work_dir, data_root):
    runner = build_runner(work_dir, data_root, 3, {
        'env_cfg.dist_cfg.timeout': 6,
        'mmddp_ext_cfg.rank_consistency': None,
        'mmddp_ext_cfg.nonfinite_skip': None,
    })
    runner.register_hook(_StallRank1(), priority='LOWEST')
    runner.train()


def test_stalled_rank_turns_into_an_error_naming_every_rank(
        tmp_path, synthetic_root):
    start = time.monotonic()
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(
            _train_with_stall, 2, args=(str(tmp_path), synthetic_root),
            timeout=120, init_group=False)  # ExtRunner sets the timeout
    elapsed = time.monotonic() - start
    message = str(info.value)
    assert 'mmddp_ext: a collective failed on rank 0' in message
    assert 'rank 0: iter 2, train step' in message
    assert 'rank 1: iter 2, train step' in message
    assert 'env_cfg.dist_cfg.timeout' in message
    assert elapsed < 90
