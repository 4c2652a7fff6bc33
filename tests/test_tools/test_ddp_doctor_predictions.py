"""The DDP doctor's predictions of what N GPUs do, from probe records
written here by hand: one test per prediction text, each with a case
where it fires and one where it does not. What the texts say about DDP,
NCCL and gloo is checked against real runs elsewhere: the bucket
prediction by tests/test_hooks/test_rank_consistency_hook.py::
test_same_model_on_plain_mmengine_fails_later_and_unrelated (plain
MMEngine stops with "Expected to have finished reduction" one iteration
later), gloo's size check by test_gloo_aborts_the_rank_with_the_smaller_
buffer below."""
import torch
import torch.distributed as dist

from mmddp_ext.doctor.ddp_outcome import Context, predict
from mmddp_ext.doctor.dynamic_checks import (FixContext, analyse,
                                             check_errors, check_loss_keys,
                                             check_nonfinite, check_usage,
                                             context, gradient_check)
from mmddp_ext.runner.ddp_setup import DDPSetup

PARAMS = ['head.w', 'head.b', 'neck.w']


def _setup(wrapper='MMDistributedDataParallel', find_unused=False,
           opted_in=False):
    return DDPSetup(
        runner_type='Runner', opted_in=opted_in, ext_cfg={},
        wrapper_cfg=dict(type=wrapper), wrapper=wrapper,
        auto_ddp=wrapper == 'AutoDDP', find_unused=find_unused)


def _ctx(setup=None, hooks=(), timeout_s=1800.0):
    return Context(setup=setup or _setup(), trainable=list(PARAMS),
                   timeout_s=timeout_s, hooks=list(hooks),
                   first_bucket='float32[5000]')


def _record(k, no_grad=(), keys=('loss_cls', ), gt=2, error=None,
            divergence=None, calls=(), nonfinite=(), step=None):
    return dict(
        iteration=k, epoch=0, kind='k', gt_boxes=gt, loss_keys=list(keys),
        error=error, nonfinite_losses=list(nonfinite), nonfinite_grads=[],
        hidden_from_ddp=[], divergence=divergence, no_grad=list(no_grad),
        collectives=[dict(phase='forward', call=c, default_group=True)
                     for c in calls],
        step_time_s=1.0, peak_memory_mb=1.0, nonfinite_step=step)


def _error(kind='TypeError', phase='forward', doctor=False):
    return dict(type=kind, message='boom', phase=phase, doctor=doctor,
                after_divergence=False,
                traceback='Traceback:\n  File "x.py", line 3, in f\n')


def test_crash_on_one_rank_names_the_collective_the_peer_waits_in():
    divergence = dict(
        index=0, phase='forward',
        per_rank=['all_reduce(float32[1])', '<error: TypeError>'])
    recs = [_record(0, divergence=divergence,
                    calls=['all_reduce(float32[1])']),
            _record(0, error=_error(), divergence=divergence)]
    outcome = predict(0, recs, _ctx(timeout_s=120), {1: recs[1]['error']})
    assert outcome.fails and outcome.mechanism == 'crash'
    assert outcome.text.startswith('rank 1 raises TypeError: boom in the '
                                   'forward of iteration 0')
    assert 'rank 0 in all_reduce(float32[1])' in outcome.text
    assert 'On NCCL rank 0 waits there until the collective timeout (120 s)' \
        in outcome.text
    assert 'on gloo the wait ends with a connection error' in outcome.text

    both = [_record(0, error=_error()), _record(0, error=_error())]
    every = predict(0, both, _ctx(), {0: both[0]['error'],
                                      1: both[1]['error']})
    assert every.text.startswith('every rank raises TypeError: boom')
    assert '(no hang)' in every.text

    fine = predict(0, [_record(0), _record(0)], _ctx(), {})
    assert not fine.fails and fine.mechanism == 'none'


def test_finished_forward_meets_the_extra_collective():
    """One rank has finished its forward while the other calls one more
    all_reduce: it pairs with DDP's first bucket all-reduce."""
    divergence = dict(index=3, phase='forward',
                      per_rank=['<end of forward>', 'all_reduce(float32[1])'])
    recs = [_record(0, divergence=divergence),
            _record(0, divergence=divergence)]
    outcome = predict(0, recs, _ctx(), {})
    assert outcome.mechanism == 'collectives'
    assert ("rank 1's all_reduce(float32[1]) pairs with rank 0's DDP's "
            'first gradient-bucket all-reduce in the backward, '
            'all_reduce(float32[5000])') in outcome.text
    assert 'gloo aborts rank 1, whose buffer is the smaller' in outcome.text
    assert 'RankConsistencyHook' not in outcome.text

    hooked = predict(0, recs, _ctx(hooks=['RankConsistencyHook']), {})
    assert 'every rank raises RankDivergenceError in iteration 0 instead' \
        in hooked.text

    ops = dict(index=0, phase='forward',
               per_rank=['all_reduce(float32[4])', 'all_gather([float32[4]])'])
    differ = predict(0, [_record(0, divergence=ops),
                         _record(0, divergence=ops)], _ctx(), {})
    assert 'gloo waits until its timeout' in differ.text

    assert not predict(0, [_record(0), _record(0)], _ctx(), {}).fails


def test_gradient_bucket_predictions_per_wrapper():
    """A parameter rank 1 leaves without gradient in iteration 1: stock DDP
    leaves rank 0 waiting in the bucket's all-reduce and rank 1 fails at
    the next iteration; AutoDDP on its fast path stops every rank; with
    find_unused_parameters=True it trains."""
    recs = [_record(1), _record(1, no_grad=['head.w'], gt=0)]
    stock = predict(1, recs, _ctx(), {})
    assert stock.mechanism == 'buckets'
    assert ('rank 1 gives no gradient to head.w (0 GT boxes on rank 1), '
            'so the gradient bucket holding them is never all-reduced there'
            ) in stock.text
    assert 'rank 0 all-reduces it at the end of the backward' in stock.text
    assert ("Rank 1 raises 'Expected to have finished reduction in the "
            "prior iteration before starting a new one' when iteration 2 "
            'starts') in stock.text

    everywhere = [_record(1, no_grad=['head.w']),
                  _record(1, no_grad=['head.w'])]
    same = predict(1, everywhere, _ctx(), {})
    assert 'every rank raises' in same.text and '(no hang)' in same.text

    auto = _ctx(_setup('AutoDDP', None, opted_in=True))
    auto.autoddp_mode, auto.decision_iteration = 'static', 0
    fast = predict(1, recs, auto, {})
    assert fast.mechanism == 'autoddp'
    assert 'every rank raises UnexpectedUnusedParameterError in iteration 1' \
        in fast.text
    probe_step = predict(0, recs, auto, {})
    assert not probe_step.fails and 'without DDP' in probe_step.text

    flagged = predict(1, recs, _ctx(_setup(find_unused=True)), {})
    assert not flagged.fails

    assert not predict(1, [_record(1), _record(1)], _ctx(), {}).fails


def test_usage_check_blocks_only_where_ddp_would_fail():
    iters = [[_record(0), _record(0)],
             [_record(1), _record(1, no_grad=['head.w'], gt=0)]]
    checks = {}
    for name, setup in (('stock', _setup()),
                        ('find_unused', _setup(find_unused=True))):
        ctx = context([dict(iterations=[r[0] for r in iters]),
                       dict(iterations=[r[1] for r in iters])], setup,
                      list(PARAMS), 1800.0)
        checks[name] = check_usage(analyse(iters, ctx), ctx, FixContext(),
                                   2, 0)
    stock = checks['stock']
    assert stock.verdict == 'blocker', stock
    assert (stock.details['iteration'], stock.details['rank']) == (1, 1)
    assert stock.details['parameters'] == ['head.w']
    assert any('DDPSafeDINOHead' in line or 'empty_gt_guard' in line
               for line in stock.fix)
    assert checks['find_unused'].verdict == 'ok'
    assert 'find_unused_parameters=True' in checks['find_unused'].summary


def test_the_timeout_in_the_texts_is_the_launchs():
    from mmengine.config import Config

    from mmddp_ext.doctor.launch_setup import collective_timeout_s
    stock = Config(dict(model=dict(type='X')))
    opt_in = Config(dict(runner_type='ExtRunner'))
    given = Config(dict(env_cfg=dict(dist_cfg=dict(timeout=77))))
    from mmddp_ext.doctor import launch_setup
    assert collective_timeout_s(stock, launch_setup(stock)) == 1800
    assert collective_timeout_s(opt_in, launch_setup(opt_in)) == 300
    assert collective_timeout_s(given, launch_setup(given)) == 77


def test_an_error_every_rank_raises_after_the_keys_differ_is_their_outcome():
    """RankConsistencyHook's RankDivergenceError on every rank after the
    loss keys differ: one loss-keys blocker whose outcome is the error,
    and no crash finding; an unrelated crash is one."""
    error = _error('RankDivergenceError')
    iters = [[_record(0, keys=('a', 'b'), error=error),
              _record(0, keys=('a', ), gt=0, error=error)]]
    ctx = _ctx()
    analyses = analyse(iters, ctx)
    assert analyses[0].reaction
    assert check_errors(analyses, 1, 0).verdict == 'ok'
    keys = check_loss_keys(analyses, FixContext(), 1, 0)
    assert keys.verdict == 'blocker', keys
    assert keys.on_gpus.startswith('every rank raises RankDivergenceError')
    assert keys.fix[0].startswith("train_dataloader = dict(collate_fn")

    crash = [[_record(0, error=_error()), _record(0)]]
    crashed = analyse(crash, ctx)
    assert not crashed[0].reaction
    assert check_errors(crashed, 1, 0).verdict == 'blocker'


def test_nonfinite_verdict_follows_what_the_step_did():
    def check(step):
        iters = [[_record(0, nonfinite=['loss_bbox'], step=step),
                  _record(0, step=step)]]
        return check_nonfinite(analyse(iters, _ctx()), 1, 0)

    skipped = check('skipped')
    assert skipped.verdict == 'warn'
    assert 'left the weights unchanged on every rank' in skipped.on_gpus
    spread = check('nonfinite weights')
    assert spread.verdict == 'blocker'
    assert 'made the weights non-finite (observed)' in spread.on_gpus
    fine = check_nonfinite(analyse([[_record(0), _record(0)]], _ctx()), 1, 0)
    assert fine.verdict == 'ok'


def _gradients(errors, code, loss_error=None, counts=((3, 3), (3, 0))):
    return dict(
        tolerance=1e-4, small_difference=1e-3, box_counts=list(counts),
        diverged=False, relative_error=dict(errors),
        loss_error=loss_error or {}, head_code=code,
        padded_shapes=dict(ranks=[[64, 64], [64, 64]], whole=[64, 64]))


def test_gradient_verdicts_by_size_and_by_whose_code_differs():
    own = {'bbox_head': dict(classes=['MyHead'], files=['/u/my_head.py'])}
    mmdet = {'bbox_head': dict(classes=['RetinaHead'], files=[])}
    large = {'backbone': 3e-2, 'bbox_head': 5e-2, '(all)': 4e-2}
    small = {'backbone': 1e-5, 'bbox_head': 4e-4, '(all)': 2e-4}
    equal = {'backbone': 1e-7, 'bbox_head': 3e-7, '(all)': 2e-7}

    blocker = gradient_check(_gradients(large, own, {'loss_cls': 2e-2}))
    assert blocker.verdict == 'blocker', blocker
    assert 'bbox_head (MyHead, code in /u/my_head.py)' in blocker.summary
    assert 'loss_cls 2.0e-02' in blocker.summary
    upstream = gradient_check(_gradients(large, mmdet))
    assert upstream.verdict == 'warn', upstream
    assert "run only MMDetection's own loss code" in upstream.summary
    minor = gradient_check(_gradients(small, own))
    assert minor.verdict == 'warn' and 'is small' in minor.summary
    ok = gradient_check(_gradients(equal, own))
    assert ok.verdict == 'ok', ok
    assert '2 ranks with 3+3 and 3+0 boxes' in ok.summary
    blind = gradient_check(_gradients(equal, own, counts=((2, 1), (2, 1))))
    assert blind.verdict == 'warn' and 'would not show' in blind.summary


def test_a_comparison_that_fails_is_a_doctor_error_unless_the_model_does():
    error = dict(type='TypeError', message='x', phase='gradient comparison',
                 doctor=True, after_divergence=False,
                 traceback='  File "/m/doctor/schedule.py", line 1\n')
    check = gradient_check(dict(error=error))
    assert (check.phase, check.verdict) == ('doctor', 'doctor error')
    assert 'rerun with --no-gradients' in check.fix[0]
    user = dict(error, doctor=False)
    same = gradient_check(dict(error=user), ['TypeError'])
    assert same.verdict == 'warn' and 'as the iterations did' in \
        same.summary


def _gloo_mismatch():
    """Rank 1 all-reduces one float while rank 0 all-reduces a bucket:
    the pairing the collectives prediction describes."""
    tensor = torch.ones(1 if dist.get_rank() == 1 else 5000)
    dist.all_reduce(tensor)
    return 'finished'


def test_gloo_aborts_the_rank_with_the_smaller_buffer():
    """What the collectives prediction says gloo does, on real gloo: the
    rank with the smaller buffer aborts with gloo's size message."""
    import pytest

    from mmddp_ext.testing import MultiRankError, run_on_ranks
    with pytest.raises(MultiRankError) as info:
        run_on_ranks(_gloo_mismatch, 2, timeout=60)
    message = str(info.value)
    rank1 = message.split('===== rank 1')[1]
    assert "Received data size doesn't match expected size" in rank1
    assert 'exit code -6' in rank1  # SIGABRT


def test_head_code_names_the_files_outside_mmdetection():
    """MMDetection's own heads have no file of their own; a head defined
    elsewhere (here the tests' local-count head) names its file."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    import tests.test_tools.doctor_heads  # noqa: F401  (registers heads)
    from mmddp_ext.doctor.gradients import head_code
    from tests.helpers import REPO_ROOT
    path = f'{REPO_ROOT}/configs/_base_/models/dino_tiny.py'
    with DefaultScope.overwrite_default_scope('mmdet'):
        stock = MODELS.build(Config.fromfile(path).model)
        cfg = Config.fromfile(path)  # the detector edits its head's cfg
        cfg.model.bbox_head.type = 'LocalCountDINOHead'
        local = MODELS.build(cfg.model)
    assert head_code(stock) == {
        'bbox_head': dict(classes=['DINOHead'], files=[])
    }
    code = head_code(local)['bbox_head']
    assert code['classes'] == ['LocalCountDINOHead']
    assert [f.rsplit('/', 1)[-1]
            for f in code['files']] == ['doctor_heads.py']
