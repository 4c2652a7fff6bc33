"""Run time of the DDP doctor, the whole command as a user runs it.

    python benchmarks/doctor_time.py [--repeats 3] [--only tiny|co_dino]

Times ``python tools/ddp_doctor.py`` (static checks, the probe on 2 gloo
ranks with 3 iterations, the gradient comparison) on a generated
24-image synthetic COCO set, for:

  tiny      configs/dino_tiny_ddp_safe.py
  co_dino   configs/co_dino_ext.py --shrink, with the data, classes and
            its three heads' num_classes set by --cfg-options (the
            probe does not start with 80 classes against the set's 2:
            ExtRunner refuses the config)

For each run it prints the wall time, the CPU time of the command and its
children (the ranks), the load average before and after (a figure taken
under load says little about a quiet machine), the doctor's exit code and
its own phase timings; then the median wall time per config. The
figures stated in docs/doctor.md come from this script on a quiet 2-core
machine (load average below 0.5 before each run).
"""
import argparse
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

from _common import REPO_ROOT  # noqa: F401  (puts the repo on the path)

CLASSES = "('square','disc')"


def _data_options(root: str, custom_layout: bool):
    options = []
    for split, sub in (('train', 'train'), ('val', 'val'), ('test', 'val')):
        key = f'{split}_dataloader.dataset'
        options.append(f'{key}.data_root={root}/')
        if custom_layout:
            options += [
                f'{key}.ann_file={sub}/annotations.json',
                f'{key}.data_prefix.img={sub}/images/',
                f'{key}.metainfo.classes={CLASSES}',
            ]
    options += [
        f'val_evaluator.ann_file={root}/val/annotations.json',
        f'test_evaluator.ann_file={root}/val/annotations.json',
    ]
    return options


def commands(root: str):
    doctor = [sys.executable, osp.join(REPO_ROOT, 'tools', 'ddp_doctor.py')]
    return {
        'tiny': doctor + [
            osp.join(REPO_ROOT, 'configs', 'dino_tiny_ddp_safe.py'),
            '--cfg-options'
        ] + _data_options(root, custom_layout=False),
        'co_dino': doctor + [
            osp.join(REPO_ROOT, 'configs', 'co_dino_ext.py'), '--shrink',
            '--cfg-options'
        ] + _data_options(root, custom_layout=True) + [
            'model.query_head.num_classes=2',
            'model.roi_head.0.bbox_head.num_classes=2',
            'model.bbox_head.0.num_classes=2',
        ],
    }


def time_once(cmd, out_json: str) -> dict:
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    options = cmd.index('--cfg-options')
    proc = subprocess.run(
        cmd[:options] + ['--out', out_json] + cmd[options:],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS='1', OMP_WAIT_POLICY='PASSIVE'))
    wall = time.perf_counter() - start
    with open(out_json) as f:
        report = json.load(f)
    ranks = report['dynamic']['ranks'] if report.get('dynamic') else []
    return dict(
        rank_cpu_s=report['timings'].get('rank_cpu_s', []),
        setup_s=[r.get('runner_built_s', 0) for r in ranks],
        gradients_s=[r.get('gradients_s', 0) for r in ranks],
        steps_s=[[i['step_time_s'] for i in r['iterations']] for r in ranks],
        wall_s=wall,
        # The ranks fork from a fork server, not from the command: their
        # CPU time comes from the report.
        cpu_s=report['timings']['main_cpu_s'] +
        sum(report['timings'].get('rank_cpu_s', [])),
        load=(load_before, os.getloadavg()[0]),
        exit_code=proc.returncode,
        verdict=report['verdict'],
        timings=report['timings'])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--only', choices=('tiny', 'co_dino'))
    args = parser.parse_args(argv)
    from mmddp_ext.testing import make_synthetic_coco
    root = tempfile.mkdtemp(prefix='mmddp_bench_')
    make_synthetic_coco(osp.join(root, 'train'), num_images=24, empty=0.5)
    make_synthetic_coco(
        osp.join(root, 'val'), num_images=8, empty=0.25, seed=1)
    walls = {}
    for name, cmd in commands(root).items():
        if args.only and name != args.only:
            continue
        for repeat in range(args.repeats):
            run = time_once(cmd, osp.join(root, f'{name}_{repeat}.json'))
            walls.setdefault(name, []).append(run['wall_s'])
            phases = ', '.join(
                f'{k} {v:.1f}' for k, v in run['timings'].items()
                if isinstance(v, float) and k != 'main_cpu_s')
            print(f"{name} run {repeat + 1}: {run['wall_s']:.1f} s wall, "
                  f"{run['cpu_s']:.1f} s CPU (command + ranks), load "
                  f"{run['load'][0]:.2f} -> {run['load'][1]:.2f}, exit "
                  f"{run['exit_code']} ({run['verdict']}); doctor: "
                  f'{phases}', flush=True)
            print('    per rank: CPU ' + ', '.join(
                f'{v:.1f}' for v in run['rank_cpu_s']) + ' s; runner built '
                  + ', '.join(f'{v:.1f}' for v in run['setup_s']) +
                  ' s; gradient comparison ' + ', '.join(
                      f'{v:.1f}' for v in run['gradients_s']) +
                  ' s; steps ' + '; '.join(
                      ', '.join(f'{t:.1f}' for t in steps)
                      for steps in run['steps_s']) + ' s',
                  flush=True)
    for name, values in walls.items():
        print(f'{name}: median {statistics.median(values):.1f} s wall over '
              f'{len(values)} run(s)')


if __name__ == '__main__':
    main()
