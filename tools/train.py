"""Train a detector with MMDetection + mmddp_ext.

Accepts the same arguments as MMDetection's ``tools/train.py``. Differences:
it imports mmddp_ext (registering its components), uses
:class:`mmddp_ext.ExtRunner` unless the config names another
``runner_type`` (CPU/gloo launch, weights-only checkpoints), checks the
config's COCO annotation files before building anything, and accepts
``--trust-checkpoint`` for loading a legacy checkpoint. ``--resume``
(auto) keeps the config's ``load_from``: ExtRunner continues from the work
dir's latest checkpoint, or starts from ``load_from`` when there is none
yet, as it does after a torchrun restart.

Single process:  python tools/train.py CONFIG
Several ranks:   bash tools/dist_train.sh CONFIG NPROC
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
    parser = argparse.ArgumentParser(description='Train a detector')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument(
        '--amp',
        action='store_true',
        default=False,
        help='enable automatic-mixed-precision training (float16 autocast '
        'with a dynamic loss scale; CPU ranks too under ExtRunner)')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='enable automatically scaling LR.')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='If specify checkpoint path, resume from it, while if not '
        'specify, try to auto resume from the latest checkpoint '
        'in the work directory.')
    parser.add_argument(
        '--trust-checkpoint',
        action='append',
        default=[],
        metavar='PATH',
        help='allow this checkpoint to load with weights_only=False when '
        'the safe load refuses it (a legacy file you trust); repeatable')
    return parse_launch_args(parser, argv)


def parse_launch_args(parser: argparse.ArgumentParser, argv=None):
    """Add the arguments train.py and test.py share (--cfg-options,
    --launcher, --local-rank), parse ``argv`` and export LOCAL_RANK."""
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
    # torch.distributed.launch passes --local-rank (torch>=2.0) or
    # --local_rank; torchrun sets LOCAL_RANK instead.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


class _DictAction(argparse.Action):
    """Defer to MMEngine's DictAction, imported lazily so that ``--help``
    and argument errors do not wait for torch to import."""

    def __call__(self, parser, namespace, values, option_string=None):
        from mmengine.config import DictAction
        DictAction(self.option_strings, self.dest)(parser, namespace, values,
                                                   option_string)


def load_cfg(args, tool: str = 'train.py'):
    """The config of ``args.config`` with --launcher, --cfg-options and
    --work-dir applied (default ``./work_dirs/<config name>``)."""
    cfg = _fromfile(config_file(args.config, tool))
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg


def config_file(path: str, tool: str = 'train.py') -> str:
    """The file of a config path: a path relative to the current
    directory, or ``package::relative`` for a config of an installed
    OpenMMLab package (``mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py``),
    the spelling ``_base_`` entries use, which ``Config.fromfile`` does
    not accept on its own.

    Raises:
        SystemExit: The file, or the package, does not exist; the message
            names it and where it was looked for.
    """
    if '::' not in path:
        if not osp.isfile(path):
            raise SystemExit(f'{tool}: config file {path!r} does not exist '
                             '(paths are relative to the current '
                             'directory).')
        return path
    import importlib.util

    from mmengine.utils import get_installed_path
    package, relative = path.split('::', 1)
    if not package.isidentifier() or importlib.util.find_spec(
            package) is None:
        raise SystemExit(f'{tool}: {path!r} names the package {package!r}, '
                         'which is not installed; install it (pip install '
                         f'{package}) or give a file path.')
    # Where MMEngine's Config looks for a '<package>::' _base_ entry.
    configs = osp.join(get_installed_path(package), '.mim', 'configs')
    local = osp.join(configs, relative)
    if not osp.isfile(local):
        raise SystemExit(f'{tool}: {path!r}: no config {relative!r} in '
                         f'{configs}; check the name against that folder.')
    return local


def _fromfile(path: str):
    """``Config.fromfile(path)``, explaining MMEngine's refusal of a key
    that two ``_base_`` files set (typically ``runner_type`` from both
    configs/_base_/mmddp_ext.py and one of the user's bases)."""
    from mmengine.config import Config
    try:
        return Config.fromfile(path)
    except KeyError as error:
        if 'Duplicate key is not allowed among bases' not in str(error):
            raise
        raise ValueError(
            f'{path}: two of its _base_ files set the same key(s) ({error}); '
            'MMEngine refuses that. If configs/_base_/mmddp_ext.py is one of '
            'them (it sets runner_type and mmddp_ext_cfg), drop it from '
            "_base_ and set in your config: runner_type = 'ExtRunner' (or "
            'a runner derived from ExtRunner), mmddp_ext_cfg = dict(...) '
            "copied from that file, and 'mmddp_ext' in "
            'custom_imports.imports. See "Opt-in" in README.md.') from error


def build_cfg(args):
    cfg = load_cfg(args)

    if args.amp:
        if cfg.optim_wrapper.get('type', 'OptimWrapper') == 'AmpOptimWrapper':
            print('train.py: AMP is already enabled in the config.')
        else:
            cfg.optim_wrapper.type = 'AmpOptimWrapper'
            cfg.optim_wrapper.loss_scale = 'dynamic'

    if args.auto_scale_lr:
        # 'enable' may be missing: upstream CO-DETR's configs set only
        # base_batch_size, and the flag is what enables it.
        if 'base_batch_size' in (cfg.get('auto_scale_lr') or {}):
            cfg.auto_scale_lr.enable = True
        else:
            raise ValueError(
                '--auto-scale-lr needs auto_scale_lr = dict(base_batch_size='
                'N) in the config, N being the total batch size (GPUs x '
                'images per GPU) its lr was set for.')

    if args.trust_checkpoint:
        cfg.trusted_checkpoints = list(cfg.get('trusted_checkpoints',
                                               [])) + args.trust_checkpoint
    cfg.setdefault('runner_type', 'ExtRunner')
    apply_resume(args, cfg)
    return cfg


def apply_resume(args, cfg) -> None:
    """Pass --resume on. ExtRunner (the default) decides where training
    starts after a torchrun restart (``MAX_RESTARTS`` of dist_train.sh) and
    on ``--resume`` with one rule, and logs it on every rank: the run's own
    latest checkpoint, else what it started with (``load_from`` is kept).
    Another runner gets MMDetection's encoding, and a restart warns that it
    re-runs the config as given."""
    ext_runner = is_ext_runner(cfg)
    if args.resume == 'auto':
        cfg.resume = 'auto' if ext_runner else True
        if not ext_runner:
            cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    restarts = os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')
    if not ext_runner and restarts not in ('', '0'):
        print(f'train.py: restart {restarts}: runner_type='
              f'{cfg.runner_type!r} is not an ExtRunner, so this attempt '
              're-runs the config as given and does not continue from the '
              "run's own checkpoints; use runner_type='ExtRunner' (or a "
              'runner derived from it) for self-healing restarts.',
              flush=True)


def is_ext_runner(cfg) -> bool:
    """Whether ``cfg.runner_type`` is ExtRunner or derived from it (the
    runner's own test, :func:`mmddp_ext.runner.ext_cfg.opted_in`)."""
    from mmddp_ext.runner.ext_cfg import opted_in
    return opted_in(cfg)


def run(build_cfg_fn, args, mode: str = 'train',
        splits=('train', 'val', 'test'), prepare=None) -> None:
    """Build the config with ``build_cfg_fn(args)``, check the launch
    set-up and the annotation files of ``splits``, build the runner, call
    ``prepare(runner)`` if given, then ``runner.train()`` or
    ``runner.test()`` (``mode``), and tear the process group down."""
    from mmdet.utils import setup_cache_size_limit_of_dynamo
    from mmengine.registry import RUNNERS

    import mmddp_ext  # noqa: F401  (registers runner, hooks, wrappers)
    from mmddp_ext.launch.process_group import check_launch_environment
    from mmddp_ext.utils import check_config_annotations

    setup_cache_size_limit_of_dynamo()
    cfg = build_cfg_fn(args)
    check_launch_environment(args.launcher)
    check_config_annotations(cfg, splits=splits)
    check_class_counts_unless_ext_runner(cfg, splits)
    runner = RUNNERS.build(cfg)
    if prepare is not None:
        prepare(runner)
    getattr(runner, mode)()
    # Tear the process group down in step: a rank that exits while a peer
    # still holds its connections can make the peer abort at exit.
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def check_class_counts_unless_ext_runner(cfg, splits) -> None:
    """The class-count check for runners other than ExtRunner, which checks
    at construction and, under a launcher, stops every rank together."""
    from mmddp_ext.utils import check_config_class_counts
    if not is_ext_runner(cfg):
        check_config_class_counts(cfg, splits=splits)


def main(argv=None):
    run(build_cfg, parse_args(argv))


if __name__ == '__main__':
    main()
