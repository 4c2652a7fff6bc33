"""The DDP doctor's verdicts on real 2-rank gloo probes, one doctor run per
scenario (tests/test_tools/doctor_heads.py has the faulty heads). The
static checks and the prediction texts have unit tests in
test_ddp_doctor_static.py and test_ddp_doctor_predictions.py; the
doctor-vs-reality matrix is test_ddp_doctor_matrix.py."""
import json
import os
import os.path as osp
import sys
import time

import pytest

from tests.helpers import REPO_ROOT, as_cli, data_overrides

BASES = [
    osp.join(REPO_ROOT, 'configs', '_base_', name)
    for name in ('schedules/tiny_200iter.py', 'datasets/synthetic_coco.py',
                 'models/dino_tiny.py')
]
OPT_IN = osp.join(REPO_ROOT, 'configs', 'dino_tiny.py')
HEADS = 'tests.test_tools.doctor_heads'
# Quiet-machine doctor runs take 4-8 s; loaded, about three times that.
PROBE_TIMEOUT_S = 200


def _config(tmp_path, root, bases, body, imports=(HEADS, )):
    from mmengine.config import Config

    import tests.test_tools.doctor_heads  # noqa: F401  (registers heads)
    path = osp.join(str(tmp_path), 'doctor_cfg.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = {bases!r}\n'
                f'custom_imports = dict(imports={list(imports)!r}, '
                'allow_failed_imports=False)\n' + body)
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(data_overrides(root))
    return cfg


def _doctor(cfg, iters, gradients=False):
    from mmddp_ext.doctor import run_doctor
    return run_doctor(cfg, 'test', nproc=2, iters=iters,
                      gradients=gradients, timeout=PROBE_TIMEOUT_S)


def _ranks(report):
    return report.dynamic['ranks']


def test_stock_dino_unused_parameter_and_dropped_denoising(
        tmp_path, synthetic_root):
    """Stock DINO (no mmddp_ext) whose head has a parameter outside the
    loss and drops its denoising losses on a GT-less batch. The unused
    parameter is the blocker; the dropped losses change no gradient DDP
    holds and no collective (the records show it), so on their own they
    train: a warn, not the 'NCCL hangs' the doctor used to print."""
    cfg = _config(tmp_path, synthetic_root, BASES,
                  "model = dict(bbox_head=dict(type='UnusedParamDropDnHead'))")
    report = _doctor(cfg, iters=2)

    unused = report.find('dynamic', 'unused parameters')
    assert unused.verdict == 'blocker', unused
    assert 'bbox_head.unused_gate' in unused.summary
    assert 'Expected to have finished reduction' in unused.on_gpus
    assert 'when iteration 1 starts (no hang)' in unused.on_gpus
    assert any('AutoDDP' in line for line in unused.fix)
    # The mechanism, on every rank: the parameter got no gradient.
    for rank in _ranks(report):
        assert 'bbox_head.unused_gate' in rank['iterations'][0]['no_grad']

    keys = report.find('dynamic', 'loss keys')
    assert keys.verdict == 'warn', keys
    assert (keys.details['iteration'], keys.details['rank']) == (1, 1)
    assert 'dn_loss_cls' in keys.details['missing']
    assert keys.on_gpus.startswith('trains')
    assert 'hang' not in keys.on_gpus
    # Evidence: the same collectives and gradients on both ranks.
    first, second = (r['iterations'][1] for r in _ranks(report))
    assert [e['call'] for e in first['collectives']] == [
        e['call'] for e in second['collectives']]
    assert first['no_grad'] == second['no_grad'] == ['bbox_head.unused_gate']
    assert any("custom_imports = dict(imports=['tests.test_tools."
               "doctor_heads', 'mmddp_ext']" in line for line in keys.fix)
    assert report.exit_code == 1


def test_opt_in_dropped_denoising_stops_every_rank(tmp_path,
                                                   synthetic_root):
    """The same head with the opt-in: AutoDDP leaves the unused parameter
    out, and the config's own RankConsistencyHook (run by the probe)
    stops every rank when the GT-less rank lacks the denoising losses.
    That is one finding, with what the hook raised as its outcome."""
    cfg = _config(tmp_path, synthetic_root, [OPT_IN],
                  "model = dict(bbox_head=dict(type='UnusedParamDropDnHead'))")
    report = _doctor(cfg, iters=2)
    unused = report.find('dynamic', 'unused parameters')
    assert unused.verdict == 'ok', unused
    assert 'AutoDDP leaves them out' in unused.summary

    keys = report.find('dynamic', 'loss keys')
    assert keys.verdict == 'blocker', keys
    assert keys.details['iteration'] == 1
    assert 'every rank raises RankDivergenceError' in keys.on_gpus
    assert '(no hang)' in keys.on_gpus
    for rank in _ranks(report):
        assert rank['iterations'][1]['error']['type'] == 'RankDivergenceError'
        assert 'RankConsistencyHook' in rank['hooks']
    # The hook's error follows from the difference: not a second blocker.
    assert report.find('dynamic', 'runs on every rank').verdict == 'ok'
    assert [c.name for c in report.checks
            if c.verdict == 'blocker'] == ['loss keys']


def test_rank_only_loss_key_and_checkpointing_conflict(
        tmp_path, synthetic_root):
    """Stock DINO with with_cp=True, find_unused_parameters=True and a loss
    term on the last rank only: the checkpointing conflict is the blocker
    (static warn, dynamic verdict); the extra term changes no gradient DDP
    holds, so it trains (warn)."""
    cfg = _config(
        tmp_path, synthetic_root, BASES,
        'find_unused_parameters = True\n'
        "model = dict(backbone=dict(with_cp=True), "
        "bbox_head=dict(type='RankOnlyLossHead'))")
    report = _doctor(cfg, iters=1)

    keys = report.find('dynamic', 'loss keys')
    assert keys.verdict == 'warn', keys
    assert (keys.details['iteration'], keys.details['rank']) == (0, 1)
    assert keys.details['extra'] == ['loss_rank_only']
    assert 'rank 1 has extra loss key(s) loss_rank_only' in keys.summary

    static = report.find('config', 'activation checkpointing')
    assert static.verdict == 'warn', static
    assert 'backbone.layer1.0' in static.summary

    dynamic = report.find('dynamic', 'checkpointing and DDP')
    assert dynamic.verdict == 'blocker', dynamic
    assert 'backbone.layer1.0' in dynamic.details['modules']
    assert 'ready only once' in dynamic.on_gpus
    for rank in _ranks(report):
        hidden = rank['iterations'][0]['hidden_from_ddp']
        assert any(n.startswith('backbone.layer1.0.') for n in hidden)


@pytest.mark.multi_rank  # the doctor it runs probes on 2 ranks
def test_ddp_safe_config_cli(tmp_path, synthetic_root, monkeypatch, capfd):
    """configs/dino_tiny_ddp_safe.py through the command line's ``main``
    (its arguments, the report on the terminal and the JSON file; run in
    this process, whose ranks' fork server has its imports done: a fresh
    interpreter would pay them twice, for itself and for its own fork
    server; test_config_path.py runs the script itself): every
    dynamic check ok, and the ranks' averaged gradient equals one
    process's over the whole batch although the ranks hold different box
    counts (the control of the local-count head below); JSON out."""
    out = osp.join(str(tmp_path), 'report.json')
    # what main changes in its process: put back after the test
    monkeypatch.setattr(sys, 'path', list(sys.path))
    monkeypatch.setenv('PYTHONPATH', os.environ.get('PYTHONPATH', ''))
    monkeypatch.setenv('OMP_NUM_THREADS',
                       os.environ.get('OMP_NUM_THREADS', '1'))
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import ddp_doctor
    start = time.monotonic()
    code = ddp_doctor.main([
        osp.join(REPO_ROOT, 'configs', 'dino_tiny_ddp_safe.py'), '--out',
        out, '--timeout', str(PROBE_TIMEOUT_S), '--cfg-options',
        *as_cli(data_overrides(synthetic_root))
    ])
    elapsed = time.monotonic() - start
    output = ''.join(capfd.readouterr())
    with open(out) as f:
        report = json.load(f)
    dynamic = [c for c in report['checks'] if c['phase'] == 'dynamic']
    assert len(dynamic) == 9
    assert all(c['verdict'] == 'ok' for c in dynamic), dynamic
    assert 'later ones not checked' in dynamic[1]['summary']  # horizon
    grads = [c for c in report['checks'] if c['phase'] == 'gradients'][0]
    assert grads['verdict'] == 'ok', grads
    equivalence = report['gradient_equivalence']
    totals = [sum(c) for c in equivalence['box_counts']]
    assert len(set(totals)) == 2, equivalence['box_counts']
    errors = equivalence['relative_error']
    assert {'backbone', 'encoder', 'decoder', 'bbox_head'} <= set(errors)
    assert max(errors.values()) <= 1e-4
    iterations = [len(r['iterations']) for r in report['dynamic']['ranks']]
    assert iterations == [3, 3]
    blockers = [c for c in report['checks'] if c['verdict'] == 'blocker']
    assert not blockers, blockers
    assert code == 0, output
    assert 'ddp_doctor [4/5] dynamic checks' in output
    assert 'gradient equivalence' in output
    print(f'doctor CLI on dino_tiny_ddp_safe.py: {elapsed:.1f} s')


def test_local_count_head_is_a_gradient_blocker(tmp_path, synthetic_root):
    """A DINO head normalising its losses by the local counts (mmdet's
    reduce_mean made the identity): same loss keys, graph and (no)
    collectives on every rank, so only the gradient comparison can see it.
    With box counts that differ by rank it does: a blocker naming the
    head, its class and its file. The DDP-safe config is the control."""
    cfg = _config(tmp_path, synthetic_root, [OPT_IN],
                  "model = dict(bbox_head=dict(type='LocalCountDINOHead'))")
    report = _doctor(cfg, iters=1, gradients=True)
    check = report.find('gradients', 'gradient equivalence')
    assert check.verdict == 'blocker', check
    assert 'bbox_head (LocalCountDINOHead, code in' in check.summary
    assert 'doctor_heads.py' in check.summary
    assert check.details['own_code_heads'] == ['bbox_head']
    assert report.gradient_equivalence['relative_error']['bbox_head'] > 1e-2
    assert 'loss_cls' in check.details['loss_terms']
    assert any('reduce_mean' in line for line in check.fix)
    counts = report.gradient_equivalence['box_counts']
    assert sum(counts[0]) != sum(counts[1])
    assert report.exit_code == 1


def test_config_hooks_run_in_the_probe_and_doctor_faults_are_its_own(
        tmp_path, synthetic_root):
    """A head that reads the epoch its config's custom hook sets trains
    (the probe runs the config's hooks and loop); the same head without
    the hook fails with the TypeError, reported with its traceback and,
    since both ranks raise, no hang. A fault in the doctor's own
    comparison code is a doctor error (exit code 2), not the user's
    blocker."""
    head = "model = dict(bbox_head=dict(type='EpochGatedHead'))\n"
    with_hook = _config(
        tmp_path, synthetic_root, BASES,
        head + "custom_hooks = [dict(type='SetHeadEpochHook')]",
        imports=(HEADS, 'tests.test_tools.doctor_faults'))
    report = _doctor(with_hook, iters=1, gradients=True)
    assert report.find('dynamic', 'runs on every rank').verdict == 'ok'
    assert 'SetHeadEpochHook' in _ranks(report)[0]['hooks']
    fault = report.find('doctor', 'gradient comparison')
    assert fault.verdict == 'doctor error', fault
    assert 'schedule.py' in fault.details['traceback']
    assert not [c for c in report.checks if c.verdict == 'blocker']
    assert report.exit_code == 2

    without = _doctor(_config(tmp_path, synthetic_root, BASES, head),
                      iters=1)
    crash = without.find('dynamic', 'runs on every rank')
    assert crash.verdict == 'blocker', crash
    assert "TypeError: '<' not supported" in crash.summary
    assert 'doctor_heads.py' in crash.details['traceback']
    assert crash.on_gpus.startswith('every rank raises TypeError')
    assert '(no hang)' in crash.on_gpus
    # The crash is the one finding: no parameter "without gradient".
    assert without.find('dynamic', 'unused parameters').verdict == 'warn'
    assert [c.name for c in without.checks
            if c.verdict == 'blocker'] == ['runs on every rank']


def test_a_fault_in_the_doctors_probe_set_up_is_a_doctor_error(
        tmp_path, synthetic_root):
    """The doctor's own code raising while it sets up the probe (after
    the config's runner built): a doctor error with its traceback, exit
    code 2, not "the config's runner does not start"."""
    cfg = _config(tmp_path, synthetic_root, BASES, '',
                  imports=(HEADS, 'tests.test_tools.doctor_setup_fault'))
    report = _doctor(cfg, iters=1)
    check = report.find('doctor', 'probe')
    assert check.verdict == 'doctor error', check
    assert 'first_bucket' in check.details['traceback']
    assert "the doctor's own code raised" in check.summary
    assert not [c for c in report.checks if c.verdict == 'blocker']
    assert report.exit_code == 2


def test_sync_bn_runs_as_its_cpu_twin(tmp_path, synthetic_root):
    """sync_bn='torch' and a detector that converts itself to SyncBN when
    distributed (as RTMDet does): torch's SyncBatchNorm raises on CPU
    ranks, so the doctor used to report a blocker and 'parameters without
    gradient'. The probe runs the CPU twin, says so, and finds nothing."""
    cfg = _config(tmp_path, synthetic_root, BASES,
                  "sync_bn = 'torch'\nmodel = dict(type='SelfSyncBNDINO')")
    report = _doctor(cfg, iters=1)
    setup = report.find('dynamic', 'how the probe ran')
    assert '20 SyncBatchNorm layer(s) ran as the doctor\'s CPU twin' in \
        setup.summary, setup
    blockers = [c for c in report.checks if c.verdict == 'blocker']
    assert not blockers, blockers
    for rank in _ranks(report):
        record = rank['iterations'][0]
        assert record['error'] is None
        # The twin's all-reduces are the model's: the same on every rank.
        assert len(record['collectives']) > 20
    assert report.find('config', 'sync_bn').verdict == 'ok'


def test_nonfinite_loss_spreads_under_stock_ddp(tmp_path, synthetic_root):
    """A NaN loss on the last rank: the probe runs the config's optimizer
    step on the averaged gradient and sees the weights turn non-finite (a
    blocker); a step that leaves them unchanged is a warn (prediction
    tests)."""
    cfg = _config(tmp_path, synthetic_root, BASES,
                  "model = dict(bbox_head=dict(type='NaNOnLastRankHead'))")
    report = _doctor(cfg, iters=1)
    check = report.find('dynamic', 'non-finite values')
    assert check.verdict == 'blocker', check
    assert 'rank 1 has non-finite loss, loss_bbox' in check.summary
    assert 'made the weights non-finite (observed)' in check.on_gpus
    assert all(r['iterations'][0]['nonfinite_step'] == 'nonfinite weights'
               for r in _ranks(report))
