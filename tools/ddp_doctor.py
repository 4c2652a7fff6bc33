"""Predict on CPU whether a config will train on N GPUs with DDP.

    python tools/ddp_doctor.py CONFIG [--nproc N] [--iters K] [--shrink]
        [--no-gradients] [--no-dynamic] [--timeout S]
        [--cfg-options k=v ...] [--out report.json]

Static checks (dataset, config, environment), a probe on N gloo ranks that
trains K iterations of an adversarial batch schedule through the config's
own runner, and a gradient-equivalence comparison; one verdict per check
(ok / warn / blocker / doctor error). Exit code 1 when any check is a
blocker, else 2 when the doctor itself failed, else 0. Works on any MMDet
3.x config, with or without mmddp_ext. docs/doctor.md describes it.
"""
import argparse
import os
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    # projects/ imports (custom_imports=['projects.CO-DETR...']) need it.
    sys.path.insert(0, REPO_ROOT)


def parse_args(argv=None):
    from train import _DictAction  # noqa: E402  (tools/ is on sys.path)
    parser = argparse.ArgumentParser(
        description='DDP doctor: will this config train on N GPUs?')
    parser.add_argument('config', help='config file path')
    parser.add_argument('--nproc', type=int, default=2,
                        help='number of ranks to check for (default 2)')
    parser.add_argument('--iters', type=int, default=3,
                        help='iterations of the adversarial schedule '
                        '(default 3: all GT, last rank without GT, one box)')
    parser.add_argument('--shrink', action='store_true',
                        help='smaller images, batches and query counts, '
                        'same layers and losses')
    parser.add_argument('--no-dynamic', action='store_true',
                        help='static checks only')
    parser.add_argument('--no-gradients', action='store_true',
                        help='skip the gradient-equivalence comparison')
    parser.add_argument('--timeout', type=float, default=600,
                        help='seconds for the dynamic probe (default 600)')
    parser.add_argument('--cfg-options', nargs='+', action=_DictAction,
                        help='override config keys, xxx=yyy')
    parser.add_argument('--out', help='write the JSON report here')
    args = parser.parse_args(argv)
    if args.nproc < 1 or args.iters < 1:
        parser.error('--nproc and --iters must be positive integers')
    return args


def main(argv=None) -> int:
    sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
    args = parse_args(argv)
    os.environ['PYTHONPATH'] = os.pathsep.join(
        p for p in (REPO_ROOT, os.environ.get('PYTHONPATH')) if p)
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    from train import config_file  # noqa: E402  (tools/ is on sys.path)
    path = config_file(args.config, 'ddp_doctor.py')
    from mmengine.config import Config
    from mmengine.logging import MMLogger

    import mmddp_ext  # noqa: F401  (registers its components)
    from mmddp_ext.doctor import log_report, run_doctor, shrink_config
    MMLogger.get_instance('ddp_doctor', log_level='INFO')
    cfg = Config.fromfile(path)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    if args.shrink:
        shrink_config(cfg)
    report = run_doctor(
        cfg,
        osp.basename(args.config),
        nproc=args.nproc,
        iters=args.iters,
        dynamic=not args.no_dynamic,
        gradients=not args.no_gradients,
        timeout=args.timeout)
    log_report(report)
    if args.out:
        report.to_json(args.out)
    return report.exit_code


if __name__ == '__main__':
    sys.exit(main())
