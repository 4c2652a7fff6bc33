"""Run every phase of the DDP doctor on a config and collect the report."""
import os
import time
from typing import Any, Dict, List, Optional

import torch.nn as nn

from .ddp_setup import resolve_setup
from .dynamic_checks import dynamic_checks, gradient_check
from .render import progress
from .report import BLOCKER, WARN, Check, DoctorReport
from .static_config import config_checks
from .static_dataset import dataset_checks
from .static_env import environment_checks

PHASES = 5
DEFAULT_TIMEOUT_S = 600


def _build_static_model(cfg) -> nn.Module:
    from mmengine.registry import init_default_scope

    from .probe import build_model, import_custom_modules
    import_custom_modules(cfg)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    return build_model(cfg)


def _run_probe(cfg, nproc: int, iters: int, gradient_check_on: bool,
               timeout: float) -> List[Dict[str, Any]]:
    from ..testing import run_on_ranks
    from .probe import probe_rank
    repo_paths = os.environ.get('PYTHONPATH', '')
    return run_on_ranks(
        probe_rank,
        world_size=nproc,
        args=(cfg, iters, gradient_check_on),
        timeout=timeout,
        env=dict(PYTHONPATH=repo_paths, OMP_NUM_THREADS=os.environ.get(
            'OMP_NUM_THREADS', '1')))


def probe_failure_summary(text: str) -> str:
    """One line on a failed probe run (``text``: the ``MultiRankError``):
    the first rank's error, or, for a timeout, the option to raise."""
    first = text.splitlines()[0] if text else 'no output'
    if 'timed out' in first:
        return f'the probe failed: {first} (on a busy machine, raise --timeout)'
    errors = [
        line.split(': ', 1)[1] for line in text.splitlines()
        if line.startswith('===== rank ') and ': ' in line
    ]
    return f'the probe failed: {first}' + (f': {errors[0]}' if errors else '')


def _dynamic(report: DoctorReport, cfg, setup, trainable: List[str],
             iters: int, gradients: bool, timeout: float) -> None:
    from ..testing import MultiRankError
    try:
        results = _run_probe(cfg, report.nproc, iters, gradients, timeout)
    except MultiRankError as error:
        text = str(error)
        report.add([
            Check('dynamic', 'runs on every rank', BLOCKER,
                  probe_failure_summary(text),
                  on_gpus='see the rank logs in details.',
                  details=dict(log=text[-6000:]))
        ])
        return
    report.timings['rank_cpu_s'] = [r['cpu_s'] for r in results]
    report.dynamic = dict(ranks=[
        {k: v for k, v in r.items() if k != 'gradients'} for r in results
    ])
    report.add(dynamic_checks(results, setup, trainable))
    if gradients:
        report.gradient_equivalence = results[0].get('gradients')
        report.add([gradient_check(report.gradient_equivalence)])


def run_doctor(cfg,
               config_name: str,
               nproc: int = 2,
               iters: int = 3,
               dynamic: bool = True,
               gradients: bool = True,
               timeout: float = DEFAULT_TIMEOUT_S) -> DoctorReport:
    """Check ``cfg`` for DDP on ``nproc`` ranks.

    Args:
        cfg (Config): The config, with overrides (and --shrink) applied.
        config_name (str): Shown in the report.
        nproc (int): Number of ranks to predict for and to probe with.
            Defaults to 2.
        iters (int): Iterations of the adversarial schedule. Defaults to 3.
        dynamic (bool): Run the probe on ``nproc`` gloo ranks. Defaults to
            True.
        gradients (bool): Compare gradients with one process (part of the
            probe). Defaults to True.
        timeout (float): Seconds for the whole probe. Defaults to 600.
    """
    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f'nproc must be a positive int, got {nproc!r}.')
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f'iters must be a positive int, got {iters!r}; '
                         'the adversarial schedule needs 2 for its GT-less '
                         'batch and 3 for its single-box batch.')
    report = DoctorReport(config=config_name, nproc=nproc, iters=iters)
    setup = resolve_setup(cfg)
    started = time.perf_counter()

    progress(1, PHASES, 'static checks: dataset')
    report.add(dataset_checks(cfg, nproc))
    progress(2, PHASES, 'static checks: config (building the model)')
    try:
        model: Optional[nn.Module] = _build_static_model(cfg)
    except Exception as error:  # a config that cannot build is a finding
        model = None
        report.add([
            Check('config', 'model builds', BLOCKER,
                  f'{type(error).__name__}: {error}',
                  on_gpus='every rank fails while building the model.')
        ])
    if model is not None:
        report.add(config_checks(cfg, nproc, setup, model))
    progress(3, PHASES, 'static checks: environment')
    report.add(environment_checks(cfg, nproc, setup))
    report.timings['static_s'] = time.perf_counter() - started

    blocking = [c for c in report.checks if c.verdict == BLOCKER and c.name
                in ('annotation files', 'model builds', 'image files')]
    if dynamic and not blocking and model is not None:
        progress(4, PHASES, f'dynamic checks: {nproc} gloo ranks, {iters} '
                 'iteration(s)' + (' + gradient equivalence'
                                   if gradients else ''))
        trainable = [n for n, p in model.named_parameters()
                     if p.requires_grad]
        start = time.perf_counter()
        _dynamic(report, cfg, setup, trainable, iters, gradients, timeout)
        report.timings['dynamic_s'] = time.perf_counter() - start
    elif dynamic:
        report.add([
            Check('dynamic', 'runs on every rank', WARN,
                  'not run: ' + '; '.join(f'{c.name} is a blocker'
                                          for c in blocking) or
                  'the model does not build')
        ])
    progress(5, PHASES, f'report: {report.verdict}')
    report.timings['total_s'] = time.perf_counter() - started
    report.timings['main_cpu_s'] = time.process_time()
    return report
