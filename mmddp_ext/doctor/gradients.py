"""Gradient equivalence: N ranks' averaged gradient against one process
over the concatenated batch, per top-level module.

DETR-family losses are normalised by counts averaged over the ranks
(``reduce_mean`` of the matched boxes and of the classification factor);
DDP then averages the gradients, so N ranks equal one process over the
whole batch exactly when each image's computation does not depend on the
rest of its batch. Four things legitimately break that and are removed
before comparing (and listed in the report): random noise in the
denoising queries, dropout, per-rank BatchNorm statistics, and denoising
groups sized by the largest GT count of the local batch (every image gets
the same number of boxes). Image padding to the largest image of the
local batch is reported when the images differ in size. A difference
that remains is a bug: a loss normalised by the local count only, or a
term computed on some ranks only.
"""
from collections import OrderedDict
from typing import Any, Dict, List

import torch
import torch.distributed as dist

from .collectives import single_process_view
from .determinism import split_invariant

FP32_TOLERANCE = 1e-4


def _grads(params) -> Dict[str, torch.Tensor]:
    return {
        n: (p.grad.detach().clone().float()
            if p.grad is not None else torch.zeros_like(p, dtype=torch.float))
        for n, p in params
    }


def relative_errors(ddp: Dict[str, torch.Tensor],
                    single: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """``|g_ddp - g_single| / |g_single|`` per top-level module (the first
    component of the parameter name) and for ``'(all)'``."""
    diff_sq: Dict[str, float] = OrderedDict()
    ref_sq: Dict[str, float] = OrderedDict()
    for name, reference in single.items():
        module = name.split('.')[0]
        diff_sq[module] = diff_sq.get(module, 0.0) + float(
            (ddp[name] - reference).pow(2).sum())
        ref_sq[module] = ref_sq.get(module, 0.0) + float(
            reference.pow(2).sum())
    diff_sq['(all)'] = sum(diff_sq.values())
    ref_sq['(all)'] = sum(ref_sq.values())
    return {
        module: (diff_sq[module]**0.5) / max(ref_sq[module]**0.5, 1e-30)
        for module in diff_sq
    }


def _padded_shape(probe, batch: dict) -> List[int]:
    return list(probe.model.data_preprocessor(batch, False)['inputs'].shape)


def compare_gradients(probe) -> Dict[str, Any]:
    """Run on every rank; rank 0's result holds the comparison."""
    batches = probe.schedule.equivalence_batches()
    model = probe.model
    result: Dict[str, Any] = dict(tolerance=FP32_TOLERANCE)
    with split_invariant(model):
        probe.optim_wrapper.zero_grad()
        probe.recorder.start_iteration()
        with probe.recorder.recording('forward'):
            _, loss, _ = probe.forward_loss(probe.collate(batches[probe.rank]))
        with probe.recorder.recording('backward'):
            loss.backward()
        from .probe import average_gradients
        average_gradients([p for _, p in probe.params])
        result['diverged'] = probe.recorder.divergence is not None
        if probe.rank == 0:
            averaged = _grads(probe.params)
            probe.optim_wrapper.zero_grad()
            whole = probe.collate([s for b in batches for s in b])
            with single_process_view():
                _, loss, _ = probe.forward_loss(whole)
                loss.backward()
            result['relative_error'] = relative_errors(
                averaged, _grads(probe.params))
            rank_shapes = [
                _padded_shape(probe, probe.collate(b))[2:] for b in batches
            ]
            result['padded_shapes'] = dict(
                ranks=rank_shapes,
                whole=_padded_shape(probe, whole)[2:])
            result['boxes_per_image'] = len(
                batches[0][0]['data_samples'].gt_instances)
        probe.optim_wrapper.zero_grad()
    return result
