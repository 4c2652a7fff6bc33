"""Shared bits for tests that launch real training runs."""
import glob
import importlib.util
import os
import os.path as osp
import re
import subprocess
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmengine.model import BaseModel

from mmddp_ext.testing import (MultiRankError, free_port, run_command,
                               run_on_ranks)

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
TINY_CONFIG = osp.join(REPO_ROOT, 'configs', 'dino_tiny.py')
FINETUNE_THREADS = 2


def data_overrides(root: str) -> Dict[str, str]:
    """Point the tiny config's train/val/test data at ``root``."""
    return {
        'train_dataloader.dataset.data_root': f'{root}/',
        'val_dataloader.dataset.data_root': f'{root}/',
        'test_dataloader.dataset.data_root': f'{root}/',
        'val_evaluator.ann_file': f'{root}/val/annotations.json',
        'test_evaluator.ann_file': f'{root}/val/annotations.json',
    }


def tiny_overrides(iters: int, val: bool = False, ckpt_every: int = 0,
                   seed: int = 0) -> Dict:
    """Few iterations, no evaluation unless asked."""
    return {
        'train_cfg.max_iters': iters,
        'train_cfg.val_interval': iters if val else iters + 1,
        'default_hooks.checkpoint.interval': ckpt_every or iters,
        'default_hooks.checkpoint.max_keep_ckpts': -1,
        'param_scheduler.1.end': iters,
        'randomness.seed': seed,
    }


def as_cli(overrides: Dict) -> List[str]:
    return [f'{k}={v}' for k, v in overrides.items()]


def data_options(root: str) -> List[str]:
    return as_cli(data_overrides(root))


def tiny_options(iters: int, **kwargs) -> List[str]:
    return as_cli(tiny_overrides(iters, **kwargs))


def dist_train(config: str, nproc: int, work_dir: str, options: List[str],
               extra_args=(), timeout: float = 150, env=None, check=True):
    """tools/dist_train.sh with a free port and a hard timeout."""
    cmd = ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), config,
           str(nproc), '--work-dir', work_dir, *extra_args]
    if options:
        cmd += ['--cfg-options', *options]
    run_env = {'PORT': str(free_port()), 'PYTHON': sys.executable}
    run_env.update(env or {})
    return run_command(
        cmd, timeout=timeout, env=run_env, cwd=REPO_ROOT,
        log_globs=[osp.join(work_dir, '*', '*.log')], check=check)


def _train_py_main(argv: List[str]) -> None:
    """``tools/train.py``'s ``main`` on a rank of :func:`run_on_ranks`
    (started with torchrun's environment, no process group yet)."""
    spec = importlib.util.spec_from_file_location(
        'mmddp_ext_tools_train', osp.join(REPO_ROOT, 'tools', 'train.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(argv)


def train_on_ranks(config: str, nproc: int, work_dir: str,
                   options: Sequence[str], extra_args: Sequence[str] = (),
                   timeout: float = 150) -> subprocess.CompletedProcess:
    """A real ``nproc``-rank training run of ``tools/train.py`` as
    ``tools/dist_train.sh`` starts it (``--launcher pytorch``, torchrun's
    ``RANK``/``WORLD_SIZE``/``MASTER_*`` variables, one OpenMP thread per
    rank), on ranks forked from :func:`run_on_ranks`'s fork server.

    What differs from :func:`dist_train`: no torchrun, and each rank starts
    with torch, MMEngine, MMDetection and mmddp_ext already imported (about
    12 CPU-seconds less per run on 2 ranks). For tests whose subject is
    what the training does, not the launcher (the launcher's own tests use
    :func:`dist_train`). A rank that fails stops the run after a short
    grace for its peers, as torchrun does; a hang ends at ``timeout``.

    Returns:
        subprocess.CompletedProcess: ``returncode`` 0 when every rank
        finished, 1 otherwise; ``stdout`` every rank's output (with the
        failure and each rank's log tail when one failed).
    """
    argv = [config, '--launcher', 'pytorch', '--work-dir', work_dir,
            *extra_args]
    if options:
        argv += ['--cfg-options', *options]
    # beside the work dir: MMEngine's own logs are work_dir/<time>/*.log
    log_dir = work_dir.rstrip(os.sep) + '_ranks'
    os.makedirs(log_dir, exist_ok=True)
    try:
        run_on_ranks(_train_py_main, nproc, args=(argv, ), timeout=timeout,
                     env={'OMP_NUM_THREADS': '1'}, log_dir=log_dir,
                     init_group=False)
        code, failure = 0, ''
    except MultiRankError as error:
        code, failure = 1, str(error)
    logs = []
    for path in sorted(glob.glob(osp.join(log_dir, 'rank*.log'))):
        with open(path) as f:
            logs.append(f.read())
    return subprocess.CompletedProcess(['train_on_ranks', *argv], code,
                                       ''.join(logs) + failure)


def logged_iters(output: str) -> List[int]:
    """Iteration numbers of the per-iteration loss lines in MMEngine's log."""
    return [int(m) for m in re.findall(r'Iter\(train\) \[\s*(\d+)/\d+\].*'
                                       r'loss: ', output)]


def checkpoints(work_dir: str) -> List[str]:
    return sorted(glob.glob(osp.join(work_dir, 'iter_*.pth')),
                  key=lambda p: int(re.search(r'iter_(\d+)', p).group(1)))


def rank0_log(work_dir: str) -> str:
    """Text of MMEngine's rank-0 log file in ``work_dir``."""
    logs = sorted(glob.glob(osp.join(work_dir, '*', '*.log')))
    logs = [p for p in logs if '_rank' not in osp.basename(p)] or logs
    with open(logs[-1]) as f:
        return f.read()


def build_runner(work_dir: str, data_root: str, iters: int,
                 overrides: Optional[Dict] = None, launcher='pytorch'):
    """The tiny DINO Runner, built in this process (call it on each rank of
    :func:`mmddp_ext.testing.run_on_ranks`)."""
    import mmddp_ext  # noqa: F401
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(TINY_CONFIG)
    cfg.merge_from_dict(data_overrides(data_root))
    cfg.merge_from_dict(tiny_overrides(iters))
    cfg.merge_from_dict(overrides or {})
    cfg.work_dir = work_dir
    cfg.launcher = launcher
    return RUNNERS.build(cfg)


def finetune_map(config: str, data_root: str, iters: int, work_dir: str,
                 seed: int = 0) -> Tuple[Dict, Dict]:
    """COCO bbox metrics (pycocotools, ``Runner.val``) of ``config``'s model
    untrained, then after ``iters`` single-process training iterations on
    ``data_root``; returns both metric dicts. Deterministic for a given
    ``seed``: seeded weights and sampler, deterministic algorithms and a
    fixed thread count. Call it after importing the project."""
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(data_overrides(data_root))
    cfg.merge_from_dict(tiny_overrides(iters, seed=seed))
    cfg.merge_from_dict({
        'randomness.deterministic': True,
        'default_hooks.logger.interval': 50,
        'default_hooks.checkpoint': None,
    })
    cfg.work_dir = work_dir
    cfg.launcher = 'none'
    runner = RUNNERS.build(cfg)
    # One process on the 2-core machines CI uses: a fixed thread count, so
    # the float reductions (and so the result) are the same everywhere.
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(FINETUNE_THREADS)
    try:
        # Runner.train initialises the weights, Runner.val does not: without
        # this, parameters made with torch.Tensor(...) (DINO's level
        # embeddings) hold uninitialised memory, boxes come out NaN, and
        # pycocotools matches a NaN IoU at every threshold (CO-DINO-tiny
        # scored mAP 0.072 with AR 1.0 that way). init_weights runs once,
        # so train() starts from these same weights.
        runner.model.init_weights()
        untrained = dict(runner.val())
        runner.train()
        trained = dict(runner.val())
    finally:
        torch.set_num_threads(threads)
    return untrained, trained


def gt_as_predictions(ann_file: str, shift: float = 0.0) -> List[Dict]:
    """Data samples (as ``DumpDetResults`` writes them) whose predictions
    are the GT boxes of ``ann_file`` with score 1, each box moved right by
    ``shift`` times its width."""
    import json

    import torch
    with open(ann_file) as f:
        coco = json.load(f)
    label_of = {c['id']: i for i, c in enumerate(coco['categories'])}
    samples = []
    for image in coco['images']:
        anns = [a for a in coco['annotations']
                if a['image_id'] == image['id']]
        boxes = torch.tensor([[x + shift * w, y, x + shift * w + w, y + h]
                              for x, y, w, h in (a['bbox'] for a in anns)],
                             dtype=torch.float32).reshape(-1, 4)
        samples.append(dict(
            img_id=image['id'],
            ori_shape=(image['height'], image['width']),
            pred_instances=dict(
                bboxes=boxes,
                scores=torch.ones(len(anns)),
                labels=torch.tensor(
                    [label_of[a['category_id']] for a in anns],
                    dtype=torch.long))))
    return samples


def coco_metrics(config: str, ann_file: str, samples: List[Dict]) -> Dict:
    """``config``'s test evaluator (pycocotools COCO bbox metrics, as
    ``tools/test.py`` builds it) on ``samples``, against ``ann_file``."""
    from mmdet.registry import METRICS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config
    register_all_modules()
    cfg = Config.fromfile(config)
    metric = METRICS.build(dict(cfg.test_evaluator, ann_file=ann_file))
    metric.dataset_meta = dict(classes=cfg.test_dataloader.dataset.metainfo[
        'classes'])
    metric.process({}, samples)
    return metric.evaluate(len(samples))


class ToyModel(BaseModel):
    """The smallest model a Runner accepts (for runner and hook tests)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return self.linear(inputs)
