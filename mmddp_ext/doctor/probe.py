"""The dynamic probe: what every rank does in K iterations of the real
config, recorded without letting a divergence hang the run.

It runs on N real gloo ranks (:func:`probe_rank` through
``mmddp_ext.testing.run_on_ranks``). DDP's reducer itself is not run:
each rank runs forward and backward alone, with the model's own
collectives (lockstepped, see :mod:`.collectives`), then the gradients are
averaged across ranks as DDP would (one flat all-reduce, missing
gradients counting as zeros) and the optimizer of the config steps. What
DDP would have made of each rank's parameter usage is predicted from the
records by :mod:`.dynamic_checks`, so a run that would hang on NCCL is
reported instead.

With mmddp_ext switched on in the config, its fixes that act inside the
process are applied as ``ExtRunner`` would: the train collate function
(``empty_gt_guard``) and ``CheckpointConflictHook``'s policy.
"""
import logging
import resource
import time
from typing import Any, Dict, List, Set

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import MMLogger

from . import checkpoint_sites
from .collectives import CollectiveRecorder
from .ddp_setup import resolve_setup
from .gradients import compare_gradients
from .schedule import AdversarialSchedule

MAX_LISTED = 20


def _drop_pretrained(node: Any) -> Any:
    """The model config without ``Pretrained`` init_cfg entries: the
    probe never downloads weights (random init is enough to see the
    graph)."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained':
            return None
        return type(node)({k: _drop_pretrained(v) for k, v in node.items()})
    if isinstance(node, list):
        return [_drop_pretrained(v) for v in node]
    return node


def build_model(cfg, seed: int = 0) -> nn.Module:
    """Build, initialise and (with a process group) sync ``cfg.model``."""
    from mmengine.registry import MODELS
    torch.manual_seed(seed)
    model = MODELS.build(_drop_pretrained(cfg.model))
    # init_weights logs every parameter's initialiser at INFO level.
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)
    if cfg.get('sync_bn'):
        from mmengine.model import convert_sync_batchnorm
        model = convert_sync_batchnorm(model, cfg.sync_bn)
    if dist.is_available() and dist.is_initialized():
        with torch.no_grad():
            for tensor in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(tensor.data, src=0)
    return model.train()


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


def _is_finite(value: Any) -> bool:
    return bool(torch.isfinite(torch.as_tensor(value)).all())


def average_gradients(params: List[nn.Parameter]) -> bool:
    """DDP's averaging: one flat all-reduce, missing gradients as zeros;
    a parameter without a gradient on every rank keeps ``grad=None``.
    Returns whether every averaged gradient is finite."""
    world_size = dist.get_world_size()
    used = torch.tensor([p.grad is not None for p in params],
                        dtype=torch.int32)
    dist.all_reduce(used)
    grads = [p.grad if p.grad is not None else torch.zeros_like(p)
             for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads]) / world_size
    dist.all_reduce(flat)
    offset = 0
    for param, grad, count in zip(params, grads, used.tolist()):
        size = grad.numel()
        param.grad = (flat[offset:offset + size].view_as(grad).to(grad.dtype)
                      if count else None)
        offset += size
    return bool(torch.isfinite(flat).all())


def peak_memory_mb() -> float:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20
    # ru_maxrss is in KiB on Linux: the process's peak resident size.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _num_gt(batch: dict) -> int:
    return sum(len(s.gt_instances) for s in batch['data_samples'])


class RankProbe:
    """One rank's model, data, optimizer and recorder."""

    def __init__(self, cfg, seed: int = 0) -> None:
        from mmengine.optim import build_optim_wrapper
        from mmengine.registry import DATASETS, FUNCTIONS
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.setup = resolve_setup(cfg)
        self.model = build_model(cfg, seed)
        self.checkpoint_sites: List[str] = []
        self.checkpoint_changed = checkpoint_sites.apply_policy(
            self.model, self.setup.checkpoint_policy)
        self.params = [(n, p) for n, p in self.model.named_parameters()
                       if p.requires_grad]
        loader = cfg.train_dataloader
        self.schedule = AdversarialSchedule(
            DATASETS.build(loader.dataset), self.world_size,
            loader.batch_size)
        collate_cfg = dict(self.setup.collate)
        collate_fn = FUNCTIONS.get(collate_cfg.pop('type'))
        self.collate = lambda samples: collate_fn(samples, **collate_cfg)
        optim_cfg = dict(cfg.optim_wrapper)
        if optim_cfg.get('type') == 'AmpOptimWrapper' and (
                not torch.cuda.is_available()):
            optim_cfg['type'] = 'OptimWrapper'  # AMP needs CUDA
            optim_cfg.pop('loss_scale', None)
        self.optim_wrapper = build_optim_wrapper(self.model, optim_cfg)
        self.side_group = dist.new_group(backend='gloo')
        self.recorder = CollectiveRecorder(self.side_group)

    def forward_loss(self, batch: dict):
        data = self.model.data_preprocessor(batch, training=True)
        losses = self.model._run_forward(data, mode='loss')
        loss, log_vars = self.model.parse_losses(losses)
        return losses, loss, log_vars

    def iteration(self, k: int) -> Dict[str, Any]:
        """Run iteration ``k`` of the schedule and return its record."""
        batch = self.collate(self.schedule.batch(self.rank, k))
        record: Dict[str, Any] = dict(
            iteration=k,
            kind=self.schedule.kind(k),
            gt_boxes=_num_gt(batch),
            loss_keys=[],
            error=None,
            nonfinite_losses=[],
            hidden_from_ddp=[])
        self.model.train()
        self.optim_wrapper.zero_grad()
        self.recorder.start_iteration()
        start = time.perf_counter()
        try:
            with self.recorder.recording('forward'), \
                    checkpoint_sites.observed(self.model) as sites:
                losses, loss, log_vars = self.forward_loss(batch)
            self.checkpoint_sites += [
                s for s in sites if s not in self.checkpoint_sites
            ]
            record['loss_keys'] = sorted(losses)
            record['nonfinite_losses'] = [
                key for key, value in log_vars.items()
                if not _is_finite(value)
            ]
            reached = graph_parameters(loss) if loss.requires_grad else set()
            with self.recorder.recording('backward'):
                if loss.requires_grad:
                    loss.backward()
            record['hidden_from_ddp'] = [
                n for n, p in self.params
                if p.grad is not None and id(p) not in reached
            ]
        except Exception as error:  # the report names it; peers go on
            record['error'] = f'{type(error).__name__}: {error}'[:800]
            self.recorder.report_failure(error)
        record['collectives'] = list(self.recorder.events)
        record['divergence'] = self.recorder.divergence
        record['no_grad'] = [n for n, p in self.params if p.grad is None]
        record['nonfinite_grads'] = [
            n for n, p in self.params
            if p.grad is not None and not _is_finite(p.grad)
        ][:MAX_LISTED]
        if average_gradients([p for _, p in self.params]):
            self.optim_wrapper.step()
        self.optim_wrapper.zero_grad()
        record['step_time_s'] = time.perf_counter() - start
        record['peak_memory_mb'] = peak_memory_mb()
        return record


def import_custom_modules(cfg) -> None:
    """Import the config's ``custom_imports`` (a config merged after
    loading, or one passed to a fresh process, has not done it)."""
    custom = cfg.get('custom_imports')
    if custom:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**custom)


def probe_rank(cfg, iters: int, gradient_check: bool,
               seed: int = 0) -> Dict[str, Any]:
    """Everything one rank reports (run through ``run_on_ranks``).

    Args:
        cfg (Config): The config (overrides and --shrink already
            applied).
        iters (int): Iterations of the adversarial schedule.
        gradient_check (bool): Also compare averaged gradients with one
            process over the concatenated batch (before the iterations).
        seed (int): Model initialisation seed. Defaults to 0.
    """
    from mmengine.registry import init_default_scope
    import_custom_modules(cfg)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    probe = RankProbe(cfg, seed)
    result: Dict[str, Any] = dict(
        rank=probe.rank,
        checkpoint_sites=probe.checkpoint_sites,
        checkpoint_changed=probe.checkpoint_changed)
    if gradient_check:
        result['gradients'] = compare_gradients(probe)
    result['iterations'] = [probe.iteration(k) for k in range(iters)]
    result['checkpoint_sites'] = probe.checkpoint_sites
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result['cpu_s'] = usage.ru_utime + usage.ru_stime
    return result
