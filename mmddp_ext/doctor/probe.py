"""The dynamic probe: what every rank does in K iterations of the config,
recorded without letting a divergence hang the run.

:func:`probe_rank` runs on each of N real gloo ranks (through
:func:`mmddp_ext.launch.rank_launcher.run_on_ranks`). It builds the config's
own runner (:mod:`.probe_runner`) and lets it train: hooks, message hub,
the train loop's epoch and iteration, data preprocessor and collate
function are the config's. Only the training step differs: DDP is not
built. Each rank runs forward and backward alone, with the model's own
collectives lockstepped (:mod:`.collectives`), then the gradients are
averaged across ranks as DDP's reducer would (missing ones as zeros) and
the config's optimizer steps. What DDP would have made of each rank's
records is predicted by :mod:`.ddp_outcome`, so a run that would hang on
NCCL is reported instead.

The batches come from :mod:`.schedule`. Where a GPU launch does what CPU
ranks cannot (SyncBatchNorm, AMP), the probe uses the twins of
:mod:`.cpu_twins`. CheckpointConflictHook sees no DDP wrapper here, so the
probe applies its policy itself (non-reentrant checkpointing is right with
or without a conflict).
"""
import copy
import os.path as osp
import resource
import sys
import time
from typing import Any, Dict, List, Optional, Set

import torch
import torch.distributed as dist
from mmengine.registry import init_default_scope

from ..utils.ddp_averaging import (average_gradients, broadcast_from_rank0,
                                   ranks_with_gradient)
from . import checkpoint_sites
from .collectives import CollectiveRecorder
from .cpu_twins import (describe_twins, sync_batch_norm_layers,
                        sync_batch_norm_on_cpu)
from .errors import describe_error
from .gradients import compare_gradients
from .launch_setup import import_custom_modules, launch_setup
from .probe_runner import build_probe_runner
from .schedule import AdversarialSchedule, num_boxes

MAX_LISTED = 20
# DDP's cap on its first gradient bucket (``bucket_cap_mb`` sizes the
# others).
FIRST_BUCKET_BYTES = 1024 * 1024
SETUP_ERROR_FILE = 'rank{}_setup_error.json'


def graph_parameters(loss: torch.Tensor) -> Set[int]:
    """``id`` of every parameter the autograd graph of ``loss`` reaches,
    as DDP's unused-parameter search sees it (reentrant checkpointing
    hides the parameters inside it)."""
    seen, found, stack = set(), set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        variable = getattr(node, 'variable', None)
        if variable is not None:
            found.add(id(variable))
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return found


def first_bucket(params: List[torch.nn.Parameter]) -> str:
    """DDP's first gradient bucket as ``'float32[N]'``: the last
    parameters in registration order, up to ``FIRST_BUCKET_BYTES``."""
    numel, size, dtype = 0, 0, 'float32'
    for param in reversed(params):
        dtype = str(param.dtype).replace('torch.', '')
        numel += param.numel()
        size += param.numel() * param.element_size()
        if size >= FIRST_BUCKET_BYTES:
            break
    return f'{dtype}[{numel}]'


def _is_finite(value: Any) -> bool:
    return bool(torch.isfinite(torch.as_tensor(value)).all())


def peak_memory_mb() -> float:
    # ru_maxrss is in KiB on Linux: the process's peak resident size.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class RankProbe:
    """One rank's probe; :meth:`run` is called by the runner's loop.

    Args:
        cfg (Config): The config, as given to the doctor.
        iters (int): Iterations of the adversarial schedule.
        gradient_check (bool): Compare gradients with one process first.
    """

    def __init__(self, cfg, iters: int, gradient_check: bool) -> None:
        self.cfg = cfg
        self.iters = iters
        self.gradient_check = gradient_check
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.setup = launch_setup(cfg)
        self.started = time.perf_counter()
        self.result: Dict[str, Any] = dict(
            rank=self.rank, iterations=[], checkpoint_sites=[])

    # ------------------------------------------------------------ the loop
    def run(self, loop) -> None:
        """Prepare the rank's step, then the comparison and iterations."""
        self.result['runner_built_s'] = time.perf_counter() - self.started
        self.loop, self.runner = loop, loop.runner
        self.model = self.runner.model
        self.optim_wrapper = self.runner.optim_wrapper
        broadcast_from_rank0(self.model)  # as DDP's constructor does
        self.params = [(n, p) for n, p in self.model.named_parameters()
                       if p.requires_grad]
        loader = self.cfg.train_dataloader
        self.schedule = AdversarialSchedule(
            loop.dataloader.dataset, self.world_size,
            loader.get('batch_size', 1))
        self.collate = loop.dataloader.collate_fn
        self.result.update(
            checkpoint_changed=checkpoint_sites.apply_policy(
                self.model, self.setup.checkpoint_policy),
            runner=self.runner.doctor_base_names['runner'],
            loop=self.runner.doctor_base_names['loop'],
            epoch=self.runner.epoch,
            hooks=[type(h).__name__ for h in self.runner.hooks],
            first_bucket=first_bucket([p for _, p in self.params]),
            twins=describe_twins(
                sync_batch_norm_layers(self.model),
                self.runner.doctor_precision))
        self.side_group = dist.new_group(backend='gloo')
        self.recorder = CollectiveRecorder(self.side_group)
        if self.gradient_check:
            start = time.perf_counter()
            try:
                self.result['gradients'] = compare_gradients(self)
            except Exception as error:  # its batches: every rank alike
                self.result['gradients'] = dict(
                    error=describe_error(error, 'gradient comparison'))
                self.optim_wrapper.zero_grad()
            self.result['gradients_s'] = time.perf_counter() - start
        for k in range(self.iters):
            self.result['iterations'].append(self.iteration(k))
            loop._iter += 1

    # --------------------------------------------------------- the step
    def forward_loss(self, batch: dict):
        """The training forward as ``BaseModel.train_step`` runs it; the
        loss keys are kept before ``parse_losses`` (which hooks may
        patch) runs."""
        with self.optim_wrapper.optim_context(self.model):
            data = self.model.data_preprocessor(batch, True)
            losses = self.model._run_forward(data, mode='loss')
        self._loss_keys = sorted(losses)
        loss, log_vars = self.model.parse_losses(losses)
        return losses, loss, log_vars

    def phase(self, record: dict, name: str, fn) -> bool:
        """Run ``fn`` recorded as phase ``name``; an exception is kept in
        ``record`` and the peers are told. Returns whether it ran."""
        if record['error'] is not None:
            return False
        start = time.perf_counter()
        try:
            with self.recorder.recording(name):
                fn()
            return True
        except Exception as error:  # the report names it; peers go on
            record['error'] = describe_error(
                error, name, after_divergence=self.recorder.diverged)
            self.recorder.report_failure(error)
            return False
        finally:
            record.setdefault('phase_s', {})[name] = round(
                time.perf_counter() - start, 3)

    def iteration(self, k: int) -> Dict[str, Any]:
        """Run iteration ``k`` of the schedule and return its record."""
        batch = self.collate(self.schedule.batch(self.rank, k))
        record: Dict[str, Any] = dict(
            iteration=k,
            epoch=self.runner.epoch,
            kind=self.schedule.kind(k),
            gt_boxes=sum(num_boxes(s) for s in batch['data_samples']),
            loss_keys=[],
            error=None,
            nonfinite_losses=[],
            hidden_from_ddp=[])
        self.model.train()
        self.optim_wrapper.zero_grad()
        self.recorder.start_iteration()
        start = time.perf_counter()
        state: Dict[str, Any] = {}

        def forward():
            with checkpoint_sites.observed(self.model) as sites:
                state['losses'], state['loss'], state['log_vars'] = \
                    self.forward_loss(batch)
            self.result['checkpoint_sites'] += [
                s for s in sites if s not in self.result['checkpoint_sites']
            ]

        def backward():
            loss = state['loss']
            reached = graph_parameters(loss) if loss.requires_grad else set()
            scaler = getattr(self.optim_wrapper, 'loss_scaler', None)
            if loss.requires_grad:
                # through AMP's scaler (scale 1, see cpu_twins), so that
                # its step skips non-finite gradients as on GPUs
                (loss if scaler is None else scaler.scale(loss)).backward()
            record['hidden_from_ddp'] = [
                n for n, p in self.params
                if p.grad is not None and id(p) not in reached
            ]

        self._loss_keys = []
        self.phase(
            record, 'before_train_iter hooks', lambda: self.runner.call_hook(
                'before_train_iter', batch_idx=k, data_batch=batch))
        self.phase(record, 'forward', forward)
        record['loss_keys'] = list(self._loss_keys)
        if 'log_vars' in state:
            record['nonfinite_losses'] = [
                key for key, value in state['log_vars'].items()
                if not _is_finite(value)
            ]
        self.phase(record, 'backward', backward)
        record['collectives'] = list(self.recorder.events)
        record['divergence'] = self.recorder.divergence
        record['no_grad'] = [n for n, p in self.params if p.grad is None]
        record['nonfinite_grads'] = [
            n for n, p in self.params
            if p.grad is not None and not _is_finite(p.grad)
        ][:MAX_LISTED]
        params = [p for _, p in self.params]
        counts = ranks_with_gradient(params)
        average_gradients([p for p, c in zip(params, counts) if c])
        finite = all(
            _is_finite(p.grad) for p in params if p.grad is not None)
        record['nonfinite_step'] = None
        if finite:
            self.phase(record, 'optimizer step', self.optim_wrapper.step)
        else:
            record['nonfinite_step'] = self._observe_nonfinite_step(record)
        self.optim_wrapper.zero_grad()
        self.phase(
            record, 'after_train_iter hooks',
            lambda: self.runner.call_hook(
                'after_train_iter',
                batch_idx=k,
                data_batch=batch,
                outputs=state.get('log_vars') or {}))
        record['step_time_s'] = time.perf_counter() - start
        record['peak_memory_mb'] = peak_memory_mb()
        return record

    def _observe_nonfinite_step(self, record: dict) -> str:
        """Run the config's optimizer step (with what its hooks patched
        in) on the non-finite averaged gradient and see what it does to
        the weights: ``'skipped'`` (unchanged), ``'nonfinite weights'`` or
        ``'updated'``. Weights and optimizer state are put back after, so
        that the later iterations stay meaningful."""
        params = [p for _, p in self.params]
        weights = [p.detach().clone() for p in params]
        state = copy.deepcopy(self.optim_wrapper.state_dict())
        self.phase(record, 'optimizer step', self.optim_wrapper.step)
        if not all(_is_finite(p.detach()) for p in params):
            outcome = 'nonfinite weights'
        elif all(torch.equal(p.detach(), w) for p, w in zip(params, weights)):
            outcome = 'skipped'
        else:
            outcome = 'updated'
        with torch.no_grad():
            for param, weight in zip(params, weights):
                param.copy_(weight)
        self.optim_wrapper.load_state_dict(state)
        return outcome


def _write_setup_error(result_dir: Optional[str], rank: int,
                       error: Dict[str, Any]) -> None:
    if result_dir:
        import json
        with open(osp.join(result_dir, SETUP_ERROR_FILE.format(rank)),
                  'w') as f:
            json.dump(error, f)


def probe_rank(cfg, iters: int, gradient_check: bool,
               result_dir: Optional[str] = None) -> Dict[str, Any]:
    """Everything one rank reports (run through ``run_on_ranks``).

    A failure before the first iteration (the runner does not build, a
    hook raises in ``before_train``) is written to ``result_dir`` as JSON
    (:func:`describe_error`) and re-raised, so that the launcher stops the
    peers at once.

    Args:
        cfg (Config): The config (overrides and --shrink already
            applied).
        iters (int): Iterations of the adversarial schedule.
        gradient_check (bool): Also compare averaged gradients with one
            process over the concatenated batch (before the iterations).
        result_dir (str, optional): Where setup failures are written.
    """
    rank = dist.get_rank()
    work_dir = osp.join(result_dir or '.', f'work_rank{rank}')
    with sync_batch_norm_on_cpu():
        try:
            import_custom_modules(cfg)
            init_default_scope(cfg.get('default_scope', 'mmdet'))
            probe = RankProbe(cfg, iters, gradient_check)
            runner = build_probe_runner(cfg, probe, work_dir)
            runner.train()
        except Exception as error:
            _write_setup_error(result_dir, rank,
                               describe_error(error, 'setup'))
            raise
    usage = resource.getrusage(resource.RUSAGE_SELF)
    probe.result['cpu_s'] = usage.ru_utime + usage.ru_stime
    sys.stdout.flush()
    return probe.result
