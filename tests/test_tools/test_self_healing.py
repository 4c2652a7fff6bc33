"""Self-healing runs through tools/dist_train.sh with MAX_RESTARTS=1
(issue 14, case 7), on 2 real gloo ranks with a toy model that saves a
checkpoint every iteration: torchrun restarts every rank, ExtRunner
resumes from the latest checkpoint, and AutoDDP builds DDP the way the
work dir says the run needs. (A fine-tune that checkpoints every few
iterations: test_self_healing_finetune.py.)"""
import os.path as osp
import re

from mmddp_ext.utils import load_checkpoint_file

from ..helpers import checkpoints, dist_train, logged_iters

CONFIG = osp.join(osp.dirname(osp.abspath(__file__)), 'self_healing_toy.py')
ITERS = 6
RESTART = 'ExtRunner (rank 0/2), restart 1 of at most 1 (torchrun restarted'


def _dist_train(work_dir, options):
    return dist_train(
        CONFIG, 2, work_dir, options, timeout=240, env={'MAX_RESTARTS': '1'})


def _resumed_from(after: str) -> int:
    found = re.search(
        r'resuming from \S*iter_(\d+)\.pth: the latest checkpoint this run '
        'wrote', after)
    assert found, after[:2000]
    return int(found[1])


def _assert_finished(work_dir: str, after: str, resumed_at: int) -> None:
    assert logged_iters(after) == list(range(resumed_at + 1, ITERS + 1))
    final = load_checkpoint_file(checkpoints(work_dir)[-1])
    assert final['meta']['iter'] == ITERS


def test_rank_sigkilled_mid_run_comes_back(tmp_path):
    work_dir = str(tmp_path / 'work')
    out = _dist_train(work_dir, ['custom_hooks.0.at_iter=4']).stdout
    before, after = out.split(RESTART, 1)
    assert 'failed (exitcode: -9) local_rank: 1' in before  # torchrun: why
    resumed_at = _resumed_from(after)
    # Rank 0 may still have been saving iteration 3 when rank 1 died.
    assert resumed_at in (2, 3)
    _assert_finished(work_dir, after, resumed_at)
    assert ('AutoDDP: find_unused_parameters=False (static): every '
            'trainable parameter received a gradient on every rank') in after


def test_parameter_unused_later_comes_back_with_find_unused(tmp_path):
    """The first attempt is the negative control: it dies the way runs die
    without self-healing. The restart resumes from the latest checkpoint
    (whose stored decision is the probe's, find_unused_parameters=False)
    and builds DDP with find_unused_parameters=True at once, as the work
    dir records: a fresh probe would see `late` used (rank 1 skips it from
    the 3rd call of each process) and fail again at iteration 3, with no
    restarts left."""
    work_dir = str(tmp_path / 'work')
    out = _dist_train(work_dir, ['model.used_calls=2']).stdout
    before, after = out.split(RESTART, 1)
    assert ('UnexpectedUnusedParameterError: AutoDDP (rank 1): 2 '
            'parameter(s) received no gradient') in before
    assert logged_iters(before) == [1, 2]
    need = osp.join(work_dir, 'autoddp_need.json')
    assert (f'AutoDDP: recorded in {need} that this run needs '
            'find_unused_parameters=True') in before
    assert _resumed_from(after) == 2
    assert (f'AutoDDP: find_unused_parameters=True (resumed): {need} '
            'records that this run needs it (needs_find_unused: 2 '
            'parameter(s) went unused on rank 1 after the probe step: '
            'late.{weight,bias})') in after
    assert 'UnexpectedUnusedParameterError' not in after
    _assert_finished(work_dir, after, 2)
