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
import os
import os.path as osp
import sys

TOOLS_DIR = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(TOOLS_DIR)
for path in (REPO_ROOT, TOOLS_DIR):
    # projects/ imports need the repository root; train.py's helpers are
    # shared through the tools directory.
    if path not in sys.path:
        sys.path.insert(0, path)

from train import _DictAction  # noqa: E402


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
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=_DictAction,
        help='override some settings in the used config, the key-value pair '
        'in xxx=yyy format will be merged into config file.')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def build_cfg(args):
    from mmengine.config import Config
    inputs = (('config', args.config), ('checkpoint', args.checkpoint))
    for what, path in inputs:
        if not osp.isfile(path):
            raise SystemExit(f'test.py: {what} file {path!r} does not exist '
                             '(paths are relative to the current '
                             'directory).')
    if args.out is not None and not args.out.endswith(('.pkl', '.pickle')):
        raise SystemExit(f'test.py: --out must name a .pkl file, got '
                         f'{args.out!r}.')
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
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
    import mmddp_ext  # noqa: F401  (registers runner, hooks, wrappers)
    from mmddp_ext.utils import check_config_annotations
    from mmddp_ext.utils.dist_env import check_launch_environment
    from mmdet.utils import setup_cache_size_limit_of_dynamo
    from mmengine.registry import RUNNERS

    setup_cache_size_limit_of_dynamo()
    cfg = build_cfg(args)
    check_launch_environment(args.launcher)
    check_config_annotations(cfg, splits=('test', ))
    runner = RUNNERS.build(cfg)
    if args.out is not None:
        from mmdet.evaluation import DumpDetResults
        runner.test_evaluator.metrics.append(
            DumpDetResults(out_file_path=args.out))
    runner.test()
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == '__main__':
    main()
