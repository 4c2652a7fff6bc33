"""Run every phase of the DDP doctor on a config and collect the report."""
import glob
import json
import os
import os.path as osp
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional

import torch.nn as nn

from ..launch.rank_launcher import (RANK_DEVICE_ENV, MultiRankError,
                                    run_on_ranks)
from .ddp_safe_types import ddp_safe_types
from .dynamic_checks import (FixContext, context, dynamic_checks, error_types,
                             gradient_check)
from .launch_setup import (collective_timeout_s, import_custom_modules,
                           launch_setup)
from .probe import SETUP_ERROR_FILE, probe_rank
from .probe_runner import drop_pretrained
from .render import progress
from .report import BLOCKER, DOCTOR_ERROR, WARN, Check, DoctorReport
from .static_config import config_checks
from .static_dataset import dataset_checks
from .static_env import environment_checks

PHASES = 5
DEFAULT_TIMEOUT_S = 600
# Static blockers after which the probe cannot run.
PROBE_NEEDS = ('annotation files', 'model builds', 'image files')


def _build_static_model(cfg) -> nn.Module:
    from mmengine.registry import MODELS, init_default_scope
    import_custom_modules(cfg)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    return MODELS.build(drop_pretrained(cfg.model))


def fix_context(cfg, setup, model: Optional[nn.Module]) -> FixContext:
    """What the paste lines of this config need: the DDP-safe classes
    that apply (:func:`ddp_safe_types`) and the ``custom_imports`` line
    that adds mmddp_ext."""
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    imports = [imports] if isinstance(imports, str) else list(imports)
    line = None
    if not setup.opted_in and 'mmddp_ext' not in imports:
        line = (f'custom_imports = dict(imports={imports + ["mmddp_ext"]!r}, '
                'allow_failed_imports=False)')
    return FixContext(ddp_safe_types=ddp_safe_types(model), import_line=line)


def _setup_errors(result_dir: str) -> List[Dict[str, Any]]:
    errors = []
    for path in sorted(
            glob.glob(osp.join(result_dir, SETUP_ERROR_FILE.format('*')))):
        with open(path) as f:
            errors.append(json.load(f))
    return errors


def _probe_failed(report: DoctorReport, text: str,
                  errors: List[Dict[str, Any]], timeout: float) -> None:
    """The probe did not come back: a timeout (the doctor's limit), the
    doctor's own error, the config's runner failing to start, or a start
    that an earlier blocker already explains."""
    first = text.splitlines()[0] if text else 'no output'
    if not errors:
        reason = ('did not finish in the time given (on a busy machine, '
                  'raise --timeout)' if 'timed out' in first else
                  'stopped without an error report')
        report.add([
            Check('doctor', 'probe', DOCTOR_ERROR,
                  f'the probe {reason}: {first}',
                  fix=[f'--timeout {2 * timeout:.0f}'],
                  details=dict(log=text[-6000:]))
        ])
        return
    error = errors[0]
    where = next((line.strip() for line in reversed(
        error['traceback'].splitlines()) if line.strip().startswith('File')),
                 'unknown location')
    raised = f"{error['type']}: {error['message'].splitlines()[0][:300]}"
    details = dict(error=error, traceback=error['traceback'])
    if error['doctor']:
        report.add([
            Check('doctor', 'probe', DOCTOR_ERROR,
                  f"the doctor's own code raised while setting up the "
                  f'probe: {raised} ({where}). A real launch does not run '
                  'this code; this says nothing about the config.',
                  fix=['# please report it to mmddp_ext with this '
                       'traceback'],
                  details=details)
        ])
        return
    earlier = [c.name for c in report.checks if c.verdict == BLOCKER]
    if earlier:
        report.add([
            Check('dynamic', 'runs on every rank', WARN,
                  f'not run: the runner stops at start-up with {raised}, '
                  f"after the blocker(s) above ({', '.join(earlier)})",
                  details=details)
        ])
        return
    report.add([
        Check('dynamic', 'runs on every rank', BLOCKER,
              f"the config's runner does not start: {raised}, at {where}",
              on_gpus='every rank stops with this error before training.',
              fix=[f'# fix what raises at {where} (traceback below)'],
              details=details)
    ])


def _run_probe(report: DoctorReport, cfg, setup, model: nn.Module,
               gradients: bool, timeout: float) -> None:
    result_dir = tempfile.mkdtemp(prefix='ddp_doctor_')
    try:
        results = run_on_ranks(
            probe_rank,
            world_size=report.nproc,
            args=(cfg, report.iters, gradients, result_dir),
            timeout=timeout,
            env=dict(
                PYTHONPATH=os.environ.get('PYTHONPATH', ''),
                OMP_NUM_THREADS=os.environ.get('OMP_NUM_THREADS', '1'),
                # the probe's tensors are on the CPU, whatever the caller's
                # rank device (pytest --device cuda sets it for its tests)
                **{RANK_DEVICE_ENV: 'cpu'}))
    except MultiRankError as error:
        _probe_failed(report, str(error), _setup_errors(result_dir), timeout)
        return
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)
    report.timings['rank_cpu_s'] = [r['cpu_s'] for r in results]
    report.dynamic = dict(ranks=[
        {k: v for k, v in r.items() if k != 'gradients'} for r in results
    ])
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    ctx = context(results, setup, trainable,
                  collective_timeout_s(cfg, setup))
    report.add(dynamic_checks(results, ctx, fix_context(cfg, setup, model)))
    if gradients:
        report.gradient_equivalence = results[0].get('gradients')
        report.add([
            gradient_check(report.gradient_equivalence, error_types(results))
        ])


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
                  on_gpus='every rank fails while building the model.',
                  fix=['# fix the model config (the error names the key)'])
        ])
    setup = launch_setup(cfg)
    blocking = [c for c in report.checks
                if c.verdict == BLOCKER and c.name in PROBE_NEEDS]
    probed = dynamic and not blocking
    if model is not None:
        report.add(config_checks(cfg, nproc, setup, model, probed))
    progress(3, PHASES, 'static checks: environment')
    report.add(environment_checks(cfg, nproc, setup))
    report.timings['static_s'] = time.perf_counter() - started

    if probed:
        progress(4, PHASES, f'dynamic checks: {nproc} gloo ranks, {iters} '
                 'iteration(s)' + (' + gradient equivalence'
                                   if gradients else ''))
        start = time.perf_counter()
        _run_probe(report, cfg, setup, model, gradients, timeout)
        report.timings['dynamic_s'] = time.perf_counter() - start
    elif dynamic:
        report.add([
            Check('dynamic', 'runs on every rank', WARN,
                  'not run: ' + '; '.join(f'{c.name} is a blocker'
                                          for c in blocking))
        ])
    progress(5, PHASES, f'report: {report.verdict}')
    report.timings['total_s'] = time.perf_counter() - started
    report.timings['main_cpu_s'] = time.process_time()
    return report
