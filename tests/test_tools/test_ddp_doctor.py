"""The DDP doctor's verdicts on real 2-rank gloo probes (one doctor run per
scenario; the class-count scenario is static and lives in
test_ddp_doctor_static.py)."""
import json
import os.path as osp
import subprocess
import sys
import time

from tests.helpers import REPO_ROOT, as_cli, data_overrides

BASES = [
    osp.join(REPO_ROOT, 'configs', '_base_', name)
    for name in ('schedules/tiny_200iter.py', 'datasets/synthetic_coco.py',
                 'models/dino_tiny.py')
]
OPT_IN = osp.join(REPO_ROOT, 'configs', 'dino_tiny.py')
HEADS = ("custom_imports = dict(imports=['tests.test_tools.doctor_heads'], "
         'allow_failed_imports=False)\n')
PROBE_TIMEOUT_S = 200


def _config(tmp_path, root, bases, body):
    from mmengine.config import Config

    import tests.test_tools.doctor_heads  # noqa: F401  (registers heads)
    path = osp.join(str(tmp_path), 'doctor_cfg.py')
    with open(path, 'w') as f:
        f.write(f'_base_ = {bases!r}\n' + HEADS + body)
    cfg = Config.fromfile(path)
    cfg.merge_from_dict(data_overrides(root))
    return cfg


def _doctor(cfg, iters, gradients=False):
    from mmddp_ext.doctor import run_doctor
    return run_doctor(cfg, 'test', nproc=2, iters=iters,
                      gradients=gradients, timeout=PROBE_TIMEOUT_S)


def test_stock_dino_unused_parameter_and_dropped_denoising(
        tmp_path, synthetic_root):
    """Stock DINO (no mmddp_ext) whose head has a parameter outside the
    loss and drops its denoising part on a GT-less batch."""
    cfg = _config(tmp_path, synthetic_root, BASES,
                  "model = dict(bbox_head=dict(type='UnusedParamDropDnHead'))")
    report = _doctor(cfg, iters=2)

    unused = report.find('dynamic', 'unused parameters')
    assert unused.verdict == 'blocker', unused
    assert 'bbox_head.unused_gate' in unused.summary
    assert 'AutoDDP' in unused.summary
    assert any('AutoDDP' in line for line in unused.fix)
    assert 'Expected to have finished reduction' in unused.on_gpus
    # The mechanism, on every rank: the parameter got no gradient.
    for rank in report.dynamic['ranks']:
        assert 'bbox_head.unused_gate' in rank['iterations'][0]['no_grad']

    keys = report.find('dynamic', 'loss keys')
    assert keys.verdict == 'blocker', keys
    assert keys.details['iteration'] == 1  # the adversarial iteration
    assert keys.details['rank'] == 1
    assert 'dn_loss_cls' in keys.details['missing']
    assert 'hangs in iteration 1' in keys.on_gpus
    assert report.exit_code == 1


def test_opt_in_dino_unused_parameter_is_ok(tmp_path, synthetic_root):
    """The same head with the one-line opt-in: AutoDDP takes care of the
    unused parameter."""
    cfg = _config(tmp_path, synthetic_root, [OPT_IN],
                  "model = dict(bbox_head=dict(type='UnusedParamDropDnHead'))")
    report = _doctor(cfg, iters=1)
    unused = report.find('dynamic', 'unused parameters')
    assert unused.verdict == 'ok', unused
    assert 'bbox_head.unused_gate' in unused.summary
    assert 'AutoDDP leaves them out' in unused.summary
    assert report.find('dynamic', 'gradients on every rank').verdict == 'ok'


def test_rank_only_loss_key_and_checkpointing_conflict(
        tmp_path, synthetic_root):
    """Stock DINO with with_cp=True, find_unused_parameters=True and a loss
    term on the last rank only."""
    cfg = _config(
        tmp_path, synthetic_root, BASES,
        'find_unused_parameters = True\n'
        "model = dict(backbone=dict(with_cp=True), "
        "bbox_head=dict(type='RankOnlyLossHead'))")
    report = _doctor(cfg, iters=1)

    keys = report.find('dynamic', 'loss keys')
    assert keys.verdict == 'blocker', keys
    assert (keys.details['iteration'], keys.details['rank']) == (0, 1)
    assert keys.details['extra'] == ['loss_rank_only']
    assert 'rank 1 has extra loss key(s) loss_rank_only' in keys.summary

    static = report.find('config', 'activation checkpointing')
    assert static.verdict == 'blocker', static
    assert 'backbone.layer1.0' in static.summary
    assert 'model.backbone.with_cp=False' in ' '.join(static.fix)

    dynamic = report.find('dynamic', 'checkpointing and DDP')
    assert dynamic.verdict == 'blocker', dynamic
    assert 'backbone.layer1.0' in dynamic.details['modules']
    assert 'ready only once' in dynamic.on_gpus
    for rank in report.dynamic['ranks']:
        hidden = rank['iterations'][0]['hidden_from_ddp']
        assert any(n.startswith('backbone.layer1.0.') for n in hidden)


def test_ddp_safe_config_cli(tmp_path, synthetic_root):
    """configs/dino_tiny_ddp_safe.py through the command line: every
    dynamic check ok, gradients equal within fp32 tolerance, JSON out."""
    out = osp.join(str(tmp_path), 'report.json')
    cmd = [
        sys.executable,
        osp.join(REPO_ROOT, 'tools', 'ddp_doctor.py'),
        osp.join(REPO_ROOT, 'configs', 'dino_tiny_ddp_safe.py'), '--out',
        out, '--cfg-options', *as_cli(data_overrides(synthetic_root))
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=PROBE_TIMEOUT_S + 60)
    elapsed = time.monotonic() - start
    output = proc.stdout + proc.stderr
    with open(out) as f:
        report = json.load(f)
    dynamic = [c for c in report['checks'] if c['phase'] == 'dynamic']
    assert len(dynamic) == 8
    assert all(c['verdict'] == 'ok' for c in dynamic), dynamic
    grads = [c for c in report['checks'] if c['phase'] == 'gradients'][0]
    assert grads['verdict'] == 'ok', grads
    errors = report['gradient_equivalence']['relative_error']
    assert {'backbone', 'encoder', 'decoder', 'bbox_head'} <= set(errors)
    assert max(errors.values()) <= 1e-4
    assert [len(r['iterations']) for r in report['dynamic']['ranks']] == [3,
                                                                        3]
    blockers = [c for c in report['checks'] if c['verdict'] == 'blocker']
    assert not blockers, blockers
    assert proc.returncode == 0, output
    assert 'ddp_doctor [4/5] dynamic checks' in output
    assert 'gradient equivalence' in output
    print(f'doctor CLI on dino_tiny_ddp_safe.py: {elapsed:.1f} s')
