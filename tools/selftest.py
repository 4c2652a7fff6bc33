r"""Check an install before a long job: the multi-rank tests on the chosen
device, a short AMP fine-tune of each detector family on 2 ranks, and the
port-vs-upstream benchmarks where upstream checkouts are set.

    bash tools/selftest.sh [--setup] [--device cpu|cuda] [--quick] \
        [--work-dir DIR] [--json PATH] [--only CHECK ...]

Checks, in the order of the final table:

- ``multi_rank_tests``: ``pytest -m multi_rank --device DEVICE`` (every test
  that starts ranks; ``--quick``: a small representative subset).
- ``amp_co_dino``, ``amp_rtdetrv2``, ``amp_dfine``, ``amp_deim``: one
  fine-tune each through ``tools/dist_train.sh CONFIG 2`` with
  ``optim_wrapper.type='AmpOptimWrapper'`` (float16, dynamic loss scale) on
  a generated set whose odd images have no boxes, read unshuffled, so rank
  1 trains on images without GT only. Reported: first and last logged
  loss, the iteration whose gradient norm was first finite (the loss scale
  settled), the steps the AMP scaler and the non-finite-loss hook skipped,
  the seconds per iteration, and the COCO bbox mAP (pycocotools, the
  config's val evaluator). On ``cuda`` the small real configs (CO-DINO
  tiny, RT-DETRv2-r18vd, D-FINE-N and DEIM-N custom), on ``cpu`` their
  tiny synthetic twins (float16 autocast makes CPU convolutions about 29x
  slower than float32).
- ``upstream_dfine``, ``upstream_codetr``, ``upstream_rtdetrv2``: the
  benchmarks that compare a port with upstream's own code
  (``benchmarks/dfine_vs_upstream.py``, ``benchmarks/upstream_step_time.py``),
  run only where ``DFINE_UPSTREAM``, ``CODETR_UPSTREAM`` or
  ``RTDETR_UPSTREAM`` names a checkout; otherwise skipped with the reason.

Every check writes its log to ``WORK_DIR/<check>.log``; a failing check's
tail is printed. One table ends the run; the same results, with each
check's time budget, go to a JSON file (``WORK_DIR/selftest.json`` unless
``--json`` says otherwise). The exit status is 1 when a check failed, 0
otherwise (skipped checks do not fail the run).

``--break CHECK`` (or ``MMDDP_SELFTEST_BREAK=CHECK``) makes an AMP check
fail the way a misconfigured AMP run fails: a static loss scale of 1e30
overflows every float16 gradient, the scaler skips every step and the
check reports that the scale never settled. It is the self-test's own
negative control.
"""
import argparse
import dataclasses
import datetime
import glob
import importlib.util
import json
import math
import os
import os.path as osp
import re
import shlex
import socket
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, Optional, Sequence, Tuple

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
PASSED, FAILED, SKIPPED = 'passed', 'failed', 'skipped'
BREAK_ENV = 'MMDDP_SELFTEST_BREAK'
# Static loss scale of --break: every float16 gradient overflows.
BROKEN_LOSS_SCALE = 1e30
TAIL_LINES = 40
NONFINITE_SKIP = re.compile(r'non-finite loss in iteration')
# This file's own test runs the self-test: the inner pytest leaves it out.
SELFTEST_TEST = 'tests/test_tools/test_selftest.py'
# --quick: tests that start real ranks, one per mechanism the fine-tunes
# do not already exercise (gradient averaging across ranks, the
# cross-rank non-finite skip).
QUICK_TESTS = (
    'tests/test_utils/test_ddp_averaging.py',
    'tests/test_hooks/test_nonfinite_skip_hook.py::'
    'test_nan_on_rank0_skips_the_same_step_on_every_rank',
)


@dataclasses.dataclass
class Family:
    """One detector family's AMP fine-tune.

    Args:
        check (str): Name of the check in the table.
        cpu_config (str): Config trained on CPU ranks (a tiny twin).
        cuda_config (str): Config trained on a GPU (the small real one).
        train_dataset_key (str): Key of the train dataset that reads the
            annotation file (nested in wrapping datasets).
        cuda_options (tuple): Extra ``--cfg-options`` on a GPU: what makes
            the real config train on the generated 2-class set from
            scratch (no COCO checkpoint needed).
        cuda_batch_size (int, optional): Images per rank on a GPU, where
            the recipe's would not fit the time budget beside the other
            runs (None: the recipe's). Defaults to None.
    """
    check: str
    cpu_config: str
    cuda_config: str
    train_dataset_key: str = 'train_dataloader.dataset'
    cuda_options: Tuple[str, ...] = ()
    cuda_batch_size: Optional[int] = None


# On a GPU: no COCO checkpoint to start from (the node may be offline),
# and 2 loader workers per rank (four fine-tunes and the tests share the
# node's cores).
NO_CHECKPOINT = ('load_from=None', 'model.backbone.init_cfg=None',
                 'train_dataloader.num_workers=2')
FAMILIES = (
    Family('amp_co_dino', 'configs/co_dino_tiny.py',
           'configs/co_dino_tiny.py'),
    Family(
        'amp_rtdetrv2',
        'configs/rtdetr_tiny.py',
        'projects/RT-DETR/configs/rtdetrv2_r18vd_120e_coco.py',
        cuda_options=NO_CHECKPOINT + ('model.bbox_head.num_classes=2', )),
    Family(
        'amp_dfine',
        'projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py',
        'projects/D-FINE/configs/dfine_hgnetv2_n_custom.py',
        cuda_options=NO_CHECKPOINT,
        cuda_batch_size=8),
    Family(
        'amp_deim',
        'projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py',
        'projects/DEIM/configs/deim_hgnetv2_n_custom.py',
        train_dataset_key='train_dataloader.dataset.dataset',
        cuda_options=NO_CHECKPOINT,
        cuda_batch_size=8),
)


@dataclasses.dataclass
class Upstream:
    """One port-vs-upstream benchmark.

    Args:
        check (str): Name of the check in the table.
        env (str): Environment variable naming the upstream checkout.
        what (str): What the checkout must be (for the skip reason).
        script (str): The benchmark script.
        args (tuple): Its arguments, ``{device}`` filled in.
        cpu_args (tuple): Extra arguments on CPU (smaller inputs).
    """
    check: str
    env: str
    what: str
    script: str
    args: Tuple[str, ...]
    cpu_args: Tuple[str, ...] = ()


UPSTREAMS = (
    Upstream('upstream_dfine', 'DFINE_UPSTREAM',
             'a checkout of github.com/Peterande/D-FINE',
             'benchmarks/dfine_vs_upstream.py',
             ('--sizes', 'n', '--repeats', '3')),
    Upstream('upstream_codetr', 'CODETR_UPSTREAM',
             'a checkout holding projects/CO-DETR of MMDetection 3.x',
             'benchmarks/upstream_step_time.py',
             ('--models', 'co_dino_r50', '--device', '{device}', '--steps',
              '10', '--warmup', '3'), ('--codetr-size', '320', '480')),
    Upstream('upstream_rtdetrv2', 'RTDETR_UPSTREAM',
             'a lyuwenyu/RT-DETR checkout', 'benchmarks/upstream_step_time.py',
             ('--models', 'rtdetrv2_r18vd', '--device', '{device}', '--steps',
              '10', '--warmup', '3'), ('--rtdetr-size', '320')),
)
CHECKS = (('multi_rank_tests', ) + tuple(f.check for f in FAMILIES) +
          tuple(u.check for u in UPSTREAMS))


@dataclasses.dataclass
class Plan:
    """Sizes and time limits of one self-test form (device x quick).

    Args:
        iters (int): Training iterations of each AMP fine-tune.
        train_images (int): Generated training images (odd ones empty).
        val_images (int): Generated validation images.
        finetune_timeout_s (float): Wall limit of one fine-tune.
        tests_timeout_s (float): Wall limit of the multi-rank tests.
        upstream_timeout_s (float): Wall limit of one upstream benchmark.
        test_workers (int): pytest-xdist workers for the tests (0: none).
        parallel (bool): Run the fine-tunes side by side and beside the
            tests (a GPU node's cores), instead of one after another.
        budget_s (float): What the whole form should take.
    """
    iters: int
    train_images: int
    val_images: int
    finetune_timeout_s: float
    tests_timeout_s: float
    upstream_timeout_s: float
    test_workers: int
    parallel: bool
    budget_s: float

    def step_budget_s(self) -> float:
        """Seconds one fine-tune iteration may take: the fine-tune's limit
        less 60 s for starting the ranks and evaluating, over its
        iterations."""
        return round((self.finetune_timeout_s - 60) / self.iters, 3)


def make_plan(device: str, quick: bool) -> Plan:
    """The sizes of the self-test on ``device``.

    On one H100/H200 the cuda form fits 9 minutes: the four fine-tunes
    (200 iterations each, 2 ranks sharing the GPU, 4 to 16 images per
    step) run side by side and beside the multi-rank tests (limit 330 s
    for each), then at most three upstream benchmarks run alone (60 s
    each), so the worst case is 330 + 3 * 60 = 510 s plus the data
    generation and config reading (about 10 s). The tests get the time of
    each upstream benchmark that does not run (:func:`main`): 510 s
    without upstream checkouts.
    On 2 CPU cores the quick form trains 10 iterations per family (float16
    autocast on CPU: 1.4-2.4 s per iteration, CO-DINO tiny 8 s, on a
    loaded machine; the figures show the stack works, they make no
    learning claim): the default dynamic scale (65536) first gives finite
    gradients at iteration 4 (RT-DETR tiny), 5 (D-FINE tiny), 6 (DEIM
    tiny) and 7 (CO-DINO tiny).
    """
    if device == 'cuda':
        return Plan(
            iters=40 if quick else 200,
            train_images=160,
            val_images=16,
            finetune_timeout_s=150 if quick else 330,
            tests_timeout_s=150 if quick else 330,
            upstream_timeout_s=60,
            test_workers=0 if quick else max(
                1, min(6, (os.cpu_count() or 2) // 2)),
            parallel=True,
            budget_s=300 if quick else 540)
    return Plan(
        iters=10 if quick else 30,
        train_images=8 if quick else 32,
        val_images=4 if quick else 8,
        # CO-DINO tiny took 119 s under load (10 iterations at 7.5 s)
        finetune_timeout_s=360 if quick else 900,
        tests_timeout_s=180 if quick else 1800,
        upstream_timeout_s=900,
        test_workers=0 if quick else 2,
        parallel=False,
        # measured 297-333 s beside other runs (load average 6-14)
        budget_s=360 if quick else 3600)


@dataclasses.dataclass
class Result:
    """The outcome of one check (a row of the table, an entry of the
    JSON)."""
    name: str
    status: str
    summary: str = ''
    seconds: float = 0.0
    log: Optional[str] = None
    reason: str = ''
    figures: Dict = dataclasses.field(default_factory=dict)


class Context:
    """What every check needs: device, plan, directories, environment.

    Args:
        device (str): ``'cpu'`` or ``'cuda'``.
        quick (bool): The quick form.
        work_dir (str): Where the logs, runs and data go.
        broken (Sequence[str]): AMP checks to break (the negative
            control).
    """

    def __init__(self, device: str, quick: bool, work_dir: str,
                 broken: Sequence[str]):
        self.device = device
        self.quick = quick
        self.plan = make_plan(device, quick)
        self.work_dir = work_dir
        self.broken = set(broken)
        self.data_root = osp.join(work_dir, 'data')
        # --cfg-options of each fine-tune's length (or why its config did
        # not load), read before the fine-tunes start side by side
        self.lengths: Dict[str, object] = {}

    def log_path(self, check: str) -> str:
        return osp.join(self.work_dir, f'{check}.log')

    def env(self, **extra) -> Dict[str, str]:
        env = dict(os.environ, PYTHON=sys.executable)
        env.setdefault('OMP_WAIT_POLICY', 'PASSIVE')
        env.update(extra)
        return env


def progress(message: str) -> None:
    """A progress line (the self-test is a tool: stdout is its UI)."""
    stamp = datetime.datetime.now().strftime('%H:%M:%S')
    print(f'[selftest {stamp}] {message}', flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def run_logged(cmd: List[str], log_path: str, timeout: float,
               env: Dict[str, str]) -> Tuple[int, bool]:
    """Run ``cmd`` from the repository root with its output in
    ``log_path``; on timeout, kill it with every descendant (torchrun
    starts its ranks in sessions of their own). Returns the exit status
    and whether the limit cut it."""
    from mmddp_ext.testing import kill_process_tree
    with open(log_path, 'w') as log:
        log.write('$ ' + ' '.join(shlex.quote(c) for c in cmd) + '\n')
        log.flush()
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            return proc.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            kill_process_tree(proc.pid)
            proc.wait()
            log.write(f'\n[selftest] cut at its time limit of {timeout:.0f} '
                      's\n')
            return proc.returncode, True


def tail(path: str, lines: int = TAIL_LINES) -> str:
    with open(path, errors='replace') as f:
        return ''.join(f.readlines()[-lines:])


# ------------------------------------------------------- multi-rank tests
def multi_rank_tests(ctx: Context) -> Result:
    """``pytest -m multi_rank --device DEVICE`` (the quick form: the
    marker's tests in :data:`QUICK_TESTS`); counts from its JUnit XML."""
    plan = ctx.plan
    junit = osp.join(ctx.work_dir, 'multi_rank_tests.xml')
    # each failing test's traceback, written as it fails (a run cut at
    # its limit still says why)
    failures = osp.join(ctx.work_dir, 'multi_rank_failures.log')
    for path in (junit, failures):
        if osp.exists(path):
            os.remove(path)
    targets = list(QUICK_TESTS) if ctx.quick else ['tests']
    cmd = [
        sys.executable, '-m', 'pytest', *targets, '-m', 'multi_rank',
        '--device', ctx.device, '-q', '-rfE', '-p', 'no:cacheprovider',
        f'--ignore={SELFTEST_TEST}', f'--junitxml={junit}'
    ]
    workers = plan.test_workers
    if workers and importlib.util.find_spec('xdist') is None:
        workers = 0  # pytest-xdist is not installed: one process
    if workers:
        cmd += ['-n', str(workers), '--dist', 'loadfile']
    log = ctx.log_path('multi_rank_tests')
    # tests/failure_log.py reads the variable (pytest --failure-log)
    code, cut = run_logged(cmd, log, plan.tests_timeout_s,
                           ctx.env(MMDDP_EXT_FAILURE_LOG=failures))
    counts = _junit_counts(junit)
    figures = dict(
        counts, exit_code=code, selection=' '.join(targets), workers=workers)
    if osp.exists(failures):
        figures['failure_log'] = failures
    summary = (f"{counts['passed']} passed, {counts['failed']} failed, "
               f"{counts['errors']} errors, {counts['skipped']} skipped")
    if cut:
        return Result(
            'multi_rank_tests',
            FAILED,
            summary,
            log=log,
            reason=f'cut at its limit of {plan.tests_timeout_s:.0f}'
            ' s',
            figures=figures)
    if code == 5:
        return Result(
            'multi_rank_tests',
            FAILED,
            'no test selected',
            log=log,
            reason='pytest -m multi_rank selected no test: no test in '
            f"{' '.join(targets)} carries the multi_rank marker",
            figures=figures)
    if code != 0 or counts['failed'] or counts['errors']:
        return Result(
            'multi_rank_tests',
            FAILED,
            summary,
            log=log,
            reason=f'pytest exited {code}',
            figures=figures)
    if not counts['passed']:
        return Result(
            'multi_rank_tests',
            FAILED,
            summary,
            log=log,
            reason='every selected test was skipped',
            figures=figures)
    return Result(
        'multi_rank_tests', PASSED, summary, log=log, figures=figures)


def _junit_counts(path: str) -> Dict[str, int]:
    counts = dict(tests=0, passed=0, failed=0, errors=0, skipped=0)
    if not osp.exists(path):
        return counts
    failed_ids = []
    for case in ElementTree.parse(path).getroot().iter('testcase'):
        counts['tests'] += 1
        kinds = {child.tag for child in case}
        if 'failure' in kinds:
            counts['failed'] += 1
        elif 'error' in kinds:
            counts['errors'] += 1
        elif 'skipped' in kinds:
            counts['skipped'] += 1
        else:
            counts['passed'] += 1
        if kinds & {'failure', 'error'}:
            failed_ids.append(f"{case.get('classname')}::{case.get('name')}")
    counts['failed_tests'] = failed_ids
    return counts


# ------------------------------------------------------- AMP fine-tunes
def make_data(ctx: Context) -> None:
    """The generated set of ``tools/make_synthetic_coco.py DIR --empty
    odd`` (its validation split a quarter empty), made in this process."""
    if REPO_ROOT not in sys.path:
        sys.path.insert(0, REPO_ROOT)
    from mmddp_ext.testing import make_synthetic_coco
    make_synthetic_coco(
        osp.join(ctx.data_root, 'train'),
        num_images=ctx.plan.train_images,
        empty='odd',
        seed=0)
    make_synthetic_coco(
        osp.join(ctx.data_root, 'val'),
        num_images=ctx.plan.val_images,
        empty=0.25,
        seed=1)


def finetune_options(family: Family, ctx: Context) -> List[str]:
    """``--cfg-options`` of one fine-tune: the generated data, AMP,
    the length, logging every iteration, one checkpoint and one
    evaluation at the end."""
    root = ctx.data_root
    train = family.train_dataset_key
    options = [
        f'{train}.data_root={root}/',
        f'{train}.ann_file=train/annotations.json',
        f'{train}.data_prefix.img=train/images/',
        f'{train}.metainfo.classes=[square,disc]',
        f'val_dataloader.dataset.data_root={root}/',
        'val_dataloader.dataset.ann_file=val/annotations.json',
        'val_dataloader.dataset.data_prefix.img=val/images/',
        'val_dataloader.dataset.metainfo.classes=[square,disc]',
        f'val_evaluator.ann_file={root}/val/annotations.json',
        # configs whose test split is another dataset (RT-DETRv2's COCO
        # config): the start-up class-count check reads it too
        f'test_dataloader.dataset.data_root={root}/',
        'test_dataloader.dataset.ann_file=val/annotations.json',
        'test_dataloader.dataset.data_prefix.img=val/images/',
        'test_dataloader.dataset.metainfo.classes=[square,disc]',
        f'test_evaluator.ann_file={root}/val/annotations.json',
        # rank r reads images r, r + 2, ...: rank 1 only empty ones
        'train_dataloader.sampler.shuffle=False',
        'optim_wrapper.type=AmpOptimWrapper',
        'optim_wrapper.dtype=float16',
        # every iteration's own values (no window mean): the loss, the
        # first finite gradient norm, the scale and the skip count
        'default_hooks.logger.interval=1',
        'log_processor.window_size=1',
        'default_hooks.checkpoint.max_keep_ckpts=1',
    ]
    if family.check in ctx.broken:
        options.append(f'optim_wrapper.loss_scale={BROKEN_LOSS_SCALE}')
    else:
        options.append('optim_wrapper.loss_scale=dynamic')
    if ctx.device == 'cuda':
        options += list(family.cuda_options)
    length = ctx.lengths.get(family.check)
    if isinstance(length, Exception):
        raise length
    options += length or _length_options(family, ctx)
    return options


def _length_options(family: Family, ctx: Context) -> List[str]:
    """``plan.iters`` iterations: set directly in iteration-based configs,
    as whole epochs in epoch-based ones (every config on a GPU but CO-DINO
    tiny, DEIM tiny on CPU)."""
    from mmengine.config import Config
    config = family.cuda_config if ctx.device == 'cuda' else \
        family.cpu_config
    cfg = Config.fromfile(
        osp.join(REPO_ROOT, config), import_custom_modules=False)
    iters = ctx.plan.iters
    if cfg.train_cfg.get('type') == 'IterBasedTrainLoop':
        return [
            f'train_cfg.max_iters={iters}', f'train_cfg.val_interval={iters}',
            f'default_hooks.checkpoint.interval={iters}'
        ]
    batch = cfg.train_dataloader.batch_size
    options = []
    if ctx.device == 'cuda' and family.cuda_batch_size:
        batch = family.cuda_batch_size
        options.append(f'train_dataloader.batch_size={batch}')
    per_epoch = max(1, ctx.plan.train_images // (2 * batch))
    epochs = max(1, math.ceil(iters / per_epoch))
    return options + [
        f'train_cfg.max_epochs={epochs}', f'train_cfg.val_interval={epochs}',
        f'default_hooks.checkpoint.interval={epochs}'
    ]


def amp_finetune(family: Family, ctx: Context) -> Result:
    """One family's AMP fine-tune on 2 ranks, judged from its logs:
    passed when it exits 0, a gradient norm was finite at some iteration
    (the dynamic loss scale settled), the last logged loss is finite and
    the evaluation recorded a COCO bbox mAP."""
    config = family.cuda_config if ctx.device == 'cuda' else \
        family.cpu_config
    work_dir = osp.join(ctx.work_dir, family.check)
    log = ctx.log_path(family.check)
    cmd = [
        'bash',
        osp.join(REPO_ROOT, 'tools',
                 'dist_train.sh'), config, '2', '--work-dir', work_dir,
        '--cfg-options', *finetune_options(family, ctx)
    ]
    code, cut = run_logged(cmd, log, ctx.plan.finetune_timeout_s,
                           ctx.env(PORT=str(free_port())))
    figures = finetune_figures(work_dir, log)
    figures.update(
        config=config,
        exit_code=code,
        iterations_planned=ctx.plan.iters,
        step_budget_s=ctx.plan.step_budget_s(),
        broken=family.check in ctx.broken)
    summary = _finetune_summary(figures)
    if cut:
        reason = f'cut at its limit of {ctx.plan.finetune_timeout_s:.0f} s'
    elif code != 0:
        reason = f'dist_train.sh exited {code}'
    else:
        reason = _finetune_fault(figures)
    status = FAILED if reason else PASSED
    return Result(
        family.check, status, summary, log=log, reason=reason, figures=figures)


def finetune_figures(work_dir: str, log: str) -> Dict:
    """Loss, gradient norm, skips, step time and mAP of a finished run,
    from rank 0's ``vis_data/scalars.json`` and the launch log."""
    records = []
    for path in sorted(
            glob.glob(osp.join(work_dir, '*', 'vis_data', 'scalars.json'))):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    train = [r for r in records if 'loss' in r and 'step' in r]
    metrics = [r for r in records if 'coco/bbox_mAP' in r]
    with open(log, errors='replace') as f:
        nonfinite_skips = len(NONFINITE_SKIP.findall(f.read()))
    # A gradient norm is logged only once one was finite (the AMP
    # wrapper leaves the overflow norms of skipped steps out).
    settled = next((r['step'] for r in train if 'grad_norm' in r), None)
    times = [r['time'] for r in train if 'time' in r]
    losses = [r['loss'] for r in train]
    window = max(1, min(10, len(losses) // 2))
    first = statistics.fmean(losses[:window]) if losses else None
    last = statistics.fmean(losses[-window:]) if losses else None
    return dict(
        iterations_logged=len(train),
        loss_first=losses[0] if losses else None,
        loss_last=losses[-1] if losses else None,
        loss_first_window_mean=first,
        loss_last_window_mean=last,
        loss_window=window,
        loss_falls=(first is not None and last < first),
        losses_finite=all(math.isfinite(v) for v in losses),
        first_finite_grad_norm_iter=settled,
        amp_scaler_skipped_steps=(train[-1].get('amp_skipped_steps')
                                  if train else None),
        loss_scale_last=train[-1].get('loss_scale') if train else None,
        nonfinite_loss_skipped_steps=nonfinite_skips,
        seconds_per_iter_median=(statistics.median(times) if times else None),
        bbox_mAP=metrics[-1]['coco/bbox_mAP'] if metrics else None,
        bbox_mAP_50=metrics[-1].get('coco/bbox_mAP_50') if metrics else None)


def _finetune_fault(figures: Dict) -> str:
    """Why a run that exited 0 still fails the check ('' if it passes)."""
    if not figures['iterations_logged']:
        return 'no training iteration was logged'
    if figures['first_finite_grad_norm_iter'] is None:
        return ('no finite gradient norm in '
                f"{figures['iterations_logged']} iterations: the AMP loss "
                'scale never settled (every step skipped)')
    if not math.isfinite(figures['loss_last']):
        return f"the last loss is {figures['loss_last']}"
    if figures['bbox_mAP'] is None:
        return 'no COCO bbox mAP was recorded'
    return ''


def _finetune_summary(figures: Dict) -> str:

    def fmt(value, spec='.3f'):
        return '-' if value is None else format(value, spec)

    return (f"loss {fmt(figures['loss_first'])} -> "
            f"{fmt(figures['loss_last'])}, grad_norm finite from it "
            f"{fmt(figures['first_finite_grad_norm_iter'], 'd')}, skipped "
            f"{fmt(figures['amp_scaler_skipped_steps'], '.0f')} (scaler) + "
            f"{figures['nonfinite_loss_skipped_steps']} (loss), "
            f"{fmt(figures['seconds_per_iter_median'], '.2f')} s/it, mAP "
            f"{fmt(figures['bbox_mAP'])}")


# ------------------------------------------------ upstream benchmarks
RATIO_LINES = (
    # benchmarks/upstream_step_time.py
    re.compile(
        r'^(?P<label>\S+(?: \(stubbed tv\))?)\s+(?P<phase>\w+)\s+'
        r'port .*port/upstream (?P<ratio>[\d.]+)', re.M),
    # benchmarks/dfine_vs_upstream.py
    re.compile(
        r'^  (?P<phase>\w+): CPU time .*port / upstream '
        r'(?P<ratio>[\d.]+)', re.M),
)


def read_ratios(text: str) -> Dict[str, float]:
    """Port / upstream ratio per phase (training, inference, train) from
    a benchmark's printed report."""
    ratios = {}
    for pattern in RATIO_LINES:
        for match in pattern.finditer(text):
            ratios[match.group('phase')] = float(match.group('ratio'))
    return ratios


def upstream_benchmark(spec: Upstream, ctx: Context) -> Result:
    """``spec``'s benchmark when its environment variable names a
    directory; skipped (with the reason) when the variable is unset."""
    root = os.environ.get(spec.env)
    if not root:
        return Result(
            spec.check,
            SKIPPED,
            reason=f'{spec.env} is not set (set it to '
            f'{spec.what} to compare the port with upstream)')
    if not osp.isdir(root):
        return Result(
            spec.check,
            FAILED,
            reason=f'{spec.env}={root!r} is not a '
            f'directory; set it to {spec.what}')
    args = [a.format(device=ctx.device) for a in spec.args]
    if ctx.device == 'cpu':
        args += list(spec.cpu_args)
    log = ctx.log_path(spec.check)
    code, cut = run_logged([sys.executable, spec.script, *args], log,
                           ctx.plan.upstream_timeout_s, ctx.env())
    with open(log, errors='replace') as f:
        ratios = read_ratios(f.read())
    summary = ', '.join(f'{phase} port/upstream {ratio:.3f}'
                        for phase, ratio in ratios.items())
    figures = dict(ratios=ratios, exit_code=code, upstream=root)
    if cut:
        reason = f'cut at its limit of {ctx.plan.upstream_timeout_s:.0f} s'
    elif code != 0:
        reason = f'{spec.script} exited {code}'
    elif not ratios:
        reason = 'no port/upstream ratio in its output'
    else:
        reason = ''
    return Result(
        spec.check,
        FAILED if reason else PASSED,
        summary,
        log=log,
        reason=reason,
        figures=figures)


# ------------------------------------------------------------- running
def timed(check, *args) -> Result:
    """Run one check, time it, print its outcome (and a failure's tail)."""
    name = args[0].check if dataclasses.is_dataclass(args[0]) else \
        check.__name__
    progress(f'{name}: started (log {osp.join(args[-1].work_dir, name)}'
             '.log)')
    start = time.perf_counter()
    try:
        result = check(*args)
    except Exception as error:  # a fault of the self-test itself
        log = args[-1].log_path(name)
        result = Result(
            name,
            FAILED,
            log=log if osp.exists(log) else None,
            reason=f'{type(error).__name__}: {error}')
    result.seconds = round(time.perf_counter() - start, 1)
    progress(f'{result.name}: {result.status} in {result.seconds:.0f} s'
             f"{': ' + result.summary if result.summary else ''}"
             f"{' (' + result.reason + ')' if result.reason else ''}")
    if result.status == FAILED and result.log and osp.exists(result.log):
        print(
            f'----- last {TAIL_LINES} lines of {result.log} -----\n'
            f'{tail(result.log)}----- end of {result.log} -----',
            flush=True)
    return result


def run_checks(ctx: Context, selected: Sequence[str]) -> List[Result]:
    """Every selected check: on a GPU node the fine-tunes side by side and
    beside the tests, then the upstream benchmarks alone (they time)."""
    families = [f for f in FAMILIES if f.check in selected]
    if families:
        progress(f'generating {ctx.plan.train_images} training images (odd '
                 f'ones without boxes) and {ctx.plan.val_images} validation '
                 f'images in {ctx.data_root}')
        make_data(ctx)
    for family in families:
        try:
            ctx.lengths[family.check] = _length_options(family, ctx)
        except Exception as error:  # reported by the check
            ctx.lengths[family.check] = error
    jobs = []
    if 'multi_rank_tests' in selected:
        jobs.append((multi_rank_tests, ctx))
    jobs += [(amp_finetune, family, ctx) for family in families]
    if ctx.plan.parallel and len(jobs) > 1:
        with ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda job: timed(*job), jobs))
    else:
        results = [timed(*job) for job in jobs]
    for spec in UPSTREAMS:
        if spec.check in selected:
            results.append(timed(upstream_benchmark, spec, ctx))
    order = {name: index for index, name in enumerate(CHECKS)}
    return sorted(results, key=lambda r: order[r.name])


def table(results: Sequence[Result]) -> str:
    """The final table: check, status, key figures (or the reason),
    seconds."""
    rows = [('check', 'status', 'key figures', 'seconds')]
    for r in results:
        figures = r.summary
        if r.reason:
            figures = f'{figures}; {r.reason}' if figures else r.reason
        rows.append((r.name, r.status, figures, f'{r.seconds:.0f}'))
    widths = [max(len(row[i]) for row in rows) for i in (0, 1)]
    lines = []
    for index, row in enumerate(rows):
        lines.append(f'{row[0]:{widths[0]}}  {row[1]:{widths[1]}}  '
                     f'{row[3]:>7}  {row[2]}')
        if index == 0:
            lines.append('-' * len(lines[0]))
    return '\n'.join(lines)


def device_info(device: str) -> Dict:
    import torch
    info = dict(device=device, torch=torch.__version__)
    if device == 'cuda':
        info['card'] = torch.cuda.get_device_name(0)
    return info


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--device',
        choices=('cpu', 'cuda'),
        default=None,
        help='where the tests and fine-tunes run (default: '
        'cuda when a GPU is available, else cpu)')
    parser.add_argument(
        '--quick',
        action='store_true',
        help='the small form (the CPU one runs in CI)')
    parser.add_argument(
        '--work-dir',
        default=None,
        help='logs, runs and data (default: '
        'work_dirs/selftest_<device>[_quick])')
    parser.add_argument(
        '--json',
        default=None,
        help='the JSON results (default: '
        'WORK_DIR/selftest.json)')
    parser.add_argument(
        '--iters',
        type=int,
        default=None,
        help='training iterations of each AMP fine-tune '
        '(default: 200 on cuda, 10 with --quick on cpu)')
    parser.add_argument(
        '--tests-timeout',
        type=float,
        default=None,
        help='wall limit of the multi-rank tests in seconds (default on '
        'cuda: 330 plus 60 for each upstream benchmark that does not run; '
        '180 with --quick on cpu)')
    parser.add_argument(
        '--only',
        nargs='+',
        choices=CHECKS,
        default=None,
        metavar='CHECK',
        help=f"run only these checks ({', '.join(CHECKS)})")
    parser.add_argument(
        '--break',
        dest='broken',
        nargs='+',
        default=None,
        metavar='CHECK',
        help='make these AMP checks fail (the negative '
        f'control; also {BREAK_ENV}=CHECK[,CHECK])')
    return parser.parse_args(argv)


def set_tests_timeout(ctx: Context, selected: Sequence[str],
                      seconds: Optional[float]) -> None:
    """The multi-rank tests' limit: ``seconds`` if given; otherwise the
    plan's, plus, where the tests run beside the fine-tunes (a GPU node),
    the time of each upstream benchmark that will not run after them."""
    if seconds is not None:
        ctx.plan.tests_timeout_s = seconds
    elif ctx.plan.parallel:
        idle = [
            u for u in UPSTREAMS
            if u.check not in selected or not os.environ.get(u.env)
        ]
        ctx.plan.tests_timeout_s += len(idle) * ctx.plan.upstream_timeout_s


def usage_error(message: str) -> None:
    """Exit with status 2 (as argparse does), not 1 (a failed check)."""
    print(f'selftest: {message}', file=sys.stderr)
    raise SystemExit(2)


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    if device == 'cuda' and not torch.cuda.is_available():
        usage_error(f'--device cuda, but torch {torch.__version__} sees no '
                    'CUDA device; run with --device cpu or on a GPU node.')
    broken = args.broken
    if broken is None:
        broken = [b for b in os.environ.get(BREAK_ENV, '').split(',') if b]
    amp_checks = [f.check for f in FAMILIES]
    for name in broken:
        if name not in amp_checks:
            usage_error(f'--break/{BREAK_ENV} takes AMP checks '
                        f"({', '.join(amp_checks)}), got {name!r}.")
    if args.iters is not None and args.iters < 1:
        usage_error(f'--iters must be a positive integer, got {args.iters}.')
    suffix = '_quick' if args.quick else ''
    work_dir = osp.abspath(
        args.work_dir
        or osp.join(REPO_ROOT, 'work_dirs', f'selftest_{device}{suffix}'))
    os.makedirs(work_dir, exist_ok=True)
    json_path = osp.abspath(args.json or osp.join(work_dir, 'selftest.json'))
    ctx = Context(device, args.quick, work_dir, broken)
    if args.iters is not None:
        ctx.plan.iters = args.iters
    selected = args.only or CHECKS
    set_tests_timeout(ctx, selected, args.tests_timeout)
    progress(f"{'quick ' if args.quick else ''}self-test on {device}: "
             f"{', '.join(selected)}; work dir {work_dir}")
    start = time.perf_counter()
    results = run_checks(ctx, selected)
    seconds = round(time.perf_counter() - start, 1)
    failed = [r.name for r in results if r.status == FAILED]
    report = dict(
        device_info(device),
        quick=args.quick,
        date=datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec='seconds'),
        command=' '.join(['tools/selftest.sh'] + list(argv or sys.argv[1:])),
        work_dir=work_dir,
        seconds=seconds,
        budget=dict(
            dataclasses.asdict(ctx.plan),
            step_budget_s=ctx.plan.step_budget_s()),
        checks=[dataclasses.asdict(r) for r in results],
        skipped={r.name: r.reason
                 for r in results if r.status == SKIPPED},
        failed=failed,
        exit_code=1 if failed else 0)
    os.makedirs(osp.dirname(json_path), exist_ok=True)
    with open(json_path, 'w') as f:
        json.dump(report, f, indent=2)
    print('\n' + table(results))
    for name, reason in report['skipped'].items():
        print(f'skipped {name}: {reason}')
    print(f'total {seconds:.0f} s (budget {ctx.plan.budget_s:.0f} s); '
          f'JSON: {json_path}')
    print('SELFTEST FAILED: ' +
          ', '.join(failed) if failed else 'SELFTEST PASSED')
    return report['exit_code']


if __name__ == '__main__':
    sys.exit(main())
