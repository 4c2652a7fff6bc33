"""tools/selftest.sh: its quick CPU form end to end on a subset of its
checks (what CI runs), with its negative control (an AMP check broken on
purpose fails the run) in the same run."""
import json
import math
import os
import os.path as osp
import re
import subprocess

import pytest

from mmddp_ext.testing import kill_process_tree
from ..helpers import REPO_ROOT

# The quick CPU form took 357 s beside other engineers' runs (load
# average 11 on 2 cores); three times that stops a hang.
RUN_TIMEOUT_S = 1080
UPSTREAM_ENVS = ('DFINE_UPSTREAM', 'CODETR_UPSTREAM', 'RTDETR_UPSTREAM')
AMP_CHECKS = ('amp_co_dino', 'amp_rtdetrv2', 'amp_dfine', 'amp_deim')
ALL_CHECKS = ('multi_rank_tests', ) + AMP_CHECKS + (
    'upstream_dfine', 'upstream_codetr', 'upstream_rtdetrv2')


@pytest.fixture
def selftest(monkeypatch):
    """tools/selftest.py as a module: tools/ is no package, so a plain
    import with tools/ on the path (for the test)."""
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import selftest as module
    return module


def run_selftest(work_dir: str, *args: str):
    """``tools/selftest.sh --device cpu --quick`` with no upstream checkout
    set; returns its completed process and its JSON report."""
    env = {
        k: v
        for k, v in os.environ.items()
        # the outer pytest's own variables are not the inner one's
        if k not in UPSTREAM_ENVS +
        ('MMDDP_SELFTEST_BREAK', ) and not k.startswith('PYTEST_')
    }
    json_path = osp.join(work_dir, 'report', 'selftest.json')
    proc = subprocess.Popen([
        'bash', 'tools/selftest.sh', '--device', 'cpu', '--quick',
        '--work-dir', work_dir, '--json', json_path, *args
    ],
                            cwd=REPO_ROOT,
                            env=env,
                            stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            text=True)
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        kill_process_tree(proc.pid)  # the self-test, its runs, their ranks
        stdout, stderr = proc.communicate()
        pytest.fail(f'tools/selftest.sh ran past {RUN_TIMEOUT_S} s:\n'
                    f'{stdout[-6000:]}{stderr[-3000:]}')
    out = subprocess.CompletedProcess(proc.args, proc.returncode, stdout,
                                      stderr)
    assert osp.exists(json_path), out.stdout[-3000:] + out.stderr[-3000:]
    with open(json_path) as f:
        return out, json.load(f)


def table_status(stdout: str, check: str) -> str:
    """The status column of ``check``'s row in the final table."""
    match = re.search(rf'^{check}\s+(passed|failed|skipped)\s', stdout, re.M)
    assert match, f'no table row for {check}:\n{stdout[-3000:]}'
    return match.group(1)


# What CI runs of the quick CPU form: one AMP fine-tune that must pass,
# one broken on purpose (the negative control) and the upstream checks
# (skipped: no checkout). All four fine-tunes (tools/selftest.sh --device
# cpu --quick) take 120 s quiet on 2 cores, more than the suite's budget
# leaves; tests/test_amp trains every family under AMP on 2 ranks. The two
# cheapest on CPU ranks (quick form, 10 iterations, 2026-11-28: DEIM 0.32
# s/it, D-FINE 0.73, RT-DETRv2 1.19, CO-DINO 2.29): DEIM passes, D-FINE is
# broken. The multi-rank tests' check runs on its own below, on one test
# (its quick selection reruns two files of this suite: 16 s quiet; one
# of them: 6 s).
CI_CHECKS = ('amp_dfine', 'amp_deim') + ALL_CHECKS[-3:]
BROKEN = 'amp_dfine'


@pytest.mark.multi_rank
@pytest.mark.timeout(RUN_TIMEOUT_S + 60)
def test_quick_cpu_selftest_reports_passed_failed_and_skipped_checks(
        tmp_path):
    """A passing AMP check, a broken one (negative control: a static loss
    scale of 1e30 overflows every float16 gradient; the run itself exits
    0, as the scaler skips every step, and the check must still fail and
    the self-test exit 1) and the skipped upstream benchmarks, in one table
    and one JSON file."""
    out, report = run_selftest(
        str(tmp_path), '--only', *CI_CHECKS, '--break', BROKEN)
    assert out.returncode == 1, out.stdout[-6000:] + out.stderr[-3000:]
    assert f'SELFTEST FAILED: {BROKEN}' in out.stdout
    checks = {c['name']: c for c in report['checks']}
    assert tuple(checks) == tuple(c for c in ALL_CHECKS if c in CI_CHECKS)
    assert report['failed'] == [BROKEN]
    assert report['device'] == 'cpu' and report['quick'] is True
    assert report['budget']['step_budget_s'] > 0
    assert checks['amp_deim']['status'] == 'passed', checks['amp_deim']
    assert table_status(out.stdout, 'amp_deim') == 'passed'
    assert osp.isfile(checks['amp_deim']['log'])
    figures = checks['amp_deim']['figures']
    assert figures['iterations_logged'] >= 1, figures
    assert figures['losses_finite'], figures
    assert math.isfinite(figures['loss_first']), figures
    assert figures['first_finite_grad_norm_iter'] >= 1, figures
    assert 0.0 <= figures['bbox_mAP'] <= 1.0, figures
    assert figures['loss_scale_last'] is not None, figures
    broken = checks[BROKEN]
    assert table_status(out.stdout, BROKEN) == 'failed'
    assert broken['figures']['exit_code'] == 0
    assert broken['figures']['iterations_logged'] >= 1
    assert broken['figures']['first_finite_grad_norm_iter'] is None
    assert 'never settled' in broken['reason']
    # the failing step's log tail is printed
    assert f"last 40 lines of {broken['log']}" in out.stdout
    for name, env in zip(ALL_CHECKS[-3:], UPSTREAM_ENVS):
        assert checks[name]['status'] == 'skipped'
        assert table_status(out.stdout, name) == 'skipped'
        assert report['skipped'][name].startswith(f'{env} is not set')
        assert f'skipped {name}: {env} is not set' in out.stdout


@pytest.mark.multi_rank
@pytest.mark.timeout(240)
def test_multi_rank_check_counts_its_pytest_run(selftest, tmp_path,
                                                monkeypatch):
    """The multi-rank tests' check on the cheapest file of its quick
    selection (real 2-rank runs in an inner pytest): passed, with the JUnit
    counts."""
    for name in list(os.environ):
        if name.startswith('PYTEST_'):  # the outer pytest's, not the inner
            monkeypatch.delenv(name)
    monkeypatch.setattr(selftest, 'QUICK_TESTS', selftest.QUICK_TESTS[:1])
    ctx = selftest.Context('cpu', True, str(tmp_path), [])
    result = selftest.multi_rank_tests(ctx)
    assert result.status == 'passed', (result, open(result.log).read())
    assert result.figures['passed'] >= 1
    assert result.figures['failed'] == result.figures['errors'] == 0
    assert result.summary.endswith(' passed, 0 failed, 0 errors, 0 skipped')


def test_break_names_only_amp_checks(selftest, capsys):
    with pytest.raises(SystemExit) as exit_info:
        selftest.main(['--device', 'cpu', '--break', 'multi_rank_tests'])
    assert exit_info.value.code == 2  # a usage error, not a failed check
    assert "takes AMP checks (amp_co_dino, amp_rtdetrv2, amp_dfine, " \
        "amp_deim), got 'multi_rank_tests'" in capsys.readouterr().err


def test_upstream_ratios_are_read_from_the_benchmarks_own_report(
        selftest, capsys, monkeypatch):
    """The ratios come from the lines the two benchmarks print (their own
    print functions, so a changed format fails here)."""
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'benchmarks'))
    import dfine_vs_upstream
    import upstream_step_time
    upstream_step_time.report('rtdetrv2_r18vd', 'training',
                              dict(port=0.09, upstream=0.1), [0.9, 0.8])
    upstream_step_time.report('rtdetrv2_r18vd', 'inference',
                              dict(port=0.02, upstream=0.016), [1.2])
    speed = dict(
        port_cpu_s=0.6,
        upstream_cpu_s=0.8,
        cpu_ratio=0.75,
        port_wall_s=0.7,
        upstream_wall_s=0.9,
        wall_ratio=0.778)
    loss = dict(worst=1e-6, worst_key='loss_vfl', total=2e-6)
    equivalence = dict(
        eval_logits=1e-6,
        eval_boxes=1e-6,
        eval_unpaired_queries=0,
        train_logits=1e-6,
        train_boxes=1e-6,
        train_corners=1e-6,
        train_unpaired_queries=0,
        train_dn_logits=1e-6,
        train_dn_boxes=1e-6,
        train_dn_corners=1e-6,
        loss_keys_equal=True,
        loss_end_to_end=loss,
        loss_same_outputs=loss)
    step_time_text = capsys.readouterr().out
    dfine_vs_upstream._print(
        dict(
            size='n',
            equivalence=equivalence,
            speed=dict(inference=speed, train=dict(speed, cpu_ratio=0.85))))
    dfine_text = capsys.readouterr().out
    assert selftest.read_ratios(step_time_text) == dict(
        training=0.9, inference=1.25)
    assert selftest.read_ratios(dfine_text) == dict(inference=0.75, train=0.85)


def test_upstream_checks_skip_without_a_checkout_and_fail_on_a_bad_one(
        selftest, tmp_path, monkeypatch, capsys):
    """No variable: skipped with the reason, exit 0; a variable naming no
    directory: failed, exit 1 (no benchmark starts in either case)."""
    for env in UPSTREAM_ENVS:
        monkeypatch.delenv(env, raising=False)
    argv = [
        '--device', 'cpu', '--only', 'upstream_dfine', 'upstream_codetr',
        '--work-dir',
        str(tmp_path)
    ]
    assert selftest.main(argv) == 0
    skipped = capsys.readouterr().out
    assert table_status(skipped, 'upstream_dfine') == 'skipped'
    assert 'skipped upstream_codetr: CODETR_UPSTREAM is not set' in skipped
    monkeypatch.setenv('DFINE_UPSTREAM', str(tmp_path / 'no_checkout'))
    assert selftest.main(argv) == 1
    failed = capsys.readouterr().out
    assert table_status(failed, 'upstream_dfine') == 'failed'
    assert table_status(failed, 'upstream_codetr') == 'skipped'
    with open(tmp_path / 'selftest.json') as f:
        report = json.load(f)
    assert report['failed'] == ['upstream_dfine']
    assert 'is not a directory' in report['checks'][0]['reason']


def test_gpu_tests_get_the_time_of_upstream_benchmarks_that_do_not_run(
        selftest, tmp_path, monkeypatch):
    """The cuda form's 9 minutes: 330 s for the tests beside the
    fine-tunes, plus 60 s per upstream benchmark that will not run."""
    for env in UPSTREAM_ENVS:
        monkeypatch.delenv(env, raising=False)

    def limit(selected, seconds=None):
        ctx = selftest.Context('cuda', False, str(tmp_path), [])
        selftest.set_tests_timeout(ctx, selected, seconds)
        return ctx.plan.tests_timeout_s

    assert limit(ALL_CHECKS) == 330 + 3 * 60
    monkeypatch.setenv('DFINE_UPSTREAM', str(tmp_path))
    assert limit(ALL_CHECKS) == 330 + 2 * 60
    assert limit(ALL_CHECKS[:-3]) == 330 + 3 * 60
    assert limit(ALL_CHECKS, seconds=900) == 900
    # on CPU the checks run one after another: nothing to hand over
    ctx = selftest.Context('cpu', True, str(tmp_path), [])
    selftest.set_tests_timeout(ctx, ALL_CHECKS, None)
    assert ctx.plan.tests_timeout_s == 180
