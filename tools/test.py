"""Evaluate a trained detector with MMDetection + mmddp_ext.

Accepts the main arguments of MMDetection's ``tools/test.py``. Like
``tools/train.py`` it imports mmddp_ext, uses :class:`mmddp_ext.ExtRunner`
unless the config names another ``runner_type`` (CPU/gloo launch,
weights-only checkpoint loading) and checks the config's COCO annotation
files before building anything. Metrics (COCO bbox mAP with pycocotools for
the CocoMetric configs) go to MMEngine's log.

Single process:  python tools/test.py CONFIG CHECKPOINT
Several ranks:   bash tools/dist_test.sh CONFIG CHECKPOINT NPROC
"""
import argparse
import os.path as osp
import sys

TOOLS_DIR = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(TOOLS_DIR)
for path in (REPO_ROOT, TOOLS_DIR):
    # projects/ imports need the repository root; train.py's helpers are
    # shared through the tools directory.
    if path not in sys.path:
        sys.path.insert(0, path)

from train import load_cfg, parse_launch_args, run  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description='Evaluate a detector')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    parser.add_argument(
        '--work-dir', help='the directory to save the evaluation log')
    parser.add_argument(
        '--out',
        help='dump the predictions to this pickle file (.pkl) for offline '
        'evaluation')
    parser.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='allow CHECKPOINT to load with weights_only=False when the safe '
        'load refuses it (a legacy file you trust)')
    return parse_launch_args(parser, argv)


def build_cfg(args):
    cfg = load_cfg(args, tool='test.py')
    if not osp.isfile(args.checkpoint):
        raise SystemExit(f'test.py: checkpoint file {args.checkpoint!r} does '
                         'not exist (paths are relative to the current '
                         'directory).')
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        raise SystemExit(f'test.py: --out must name a .pkl file, got '
                         f'{args.out!r}.')
    for key in ('test_dataloader', 'test_evaluator', 'test_cfg'):
        if not cfg.get(key):
            raise SystemExit(
                f'test.py: the config has no {key}; evaluation needs '
                'test_dataloader, test_evaluator and test_cfg (MMDet base '
                'configs set all three).')
    cfg.load_from = args.checkpoint
    if args.trust_checkpoint:
        cfg.trusted_checkpoints = list(cfg.get('trusted_checkpoints',
                                               [])) + [args.checkpoint]
    cfg.setdefault('runner_type', 'ExtRunner')
    return cfg


def main(argv=None):
    args = parse_args(argv)

    def dump_predictions(runner):
        if args.out is not None:
            from mmdet.evaluation import DumpDetResults
            runner.test_evaluator.metrics.append(
                DumpDetResults(out_file_path=args.out))

    run(build_cfg, args, mode='test', splits=('test', ),
        prepare=dump_predictions)


if __name__ == '__main__':
    main()
