"""Gradient equivalence: N ranks' averaged gradient against one process
over the concatenated batch, per top-level module.

DETR-family losses are normalised by counts averaged over the ranks
(``reduce_mean`` of the matched boxes and of the classification factor);
DDP then averages the gradients, so N ranks equal one process over the
whole batch exactly when each image's computation does not depend on the
rest of its batch. The comparison's batches give the ranks different box
counts (see :mod:`.schedule`), so a loss normalised by a rank's own count
shows. Four things legitimately break the equality and are removed before
comparing: random noise in the denoising queries, dropout, per-rank
BatchNorm statistics (:mod:`.determinism`), and denoising groups sized by
the largest GT count of the local batch (every batch has the same
largest count). The data preprocessor runs from the same state for the
ranks and for the reference (batch augments such as
``BatchSyncRandomResize`` keep a size between calls). Padding to the
largest image of the local batch is reported when the images differ in
size (the schedule picks images of one size when it can). A difference
that remains comes from a loss normalised by a count of the local batch,
or a term computed on some ranks only.

Which code computes it decides the verdict. For each loss head (a
top-level module with a ``loss`` method, or a list of them) the files
that define its class and the classes it derives from, outside
MMDetection and its libraries, are named (:func:`head_code`). Several of
MMDetection's own heads normalise some terms by the local count by design
(``AnchorHead``'s ``avg_factor``, the RPN, RoI heads, DETR heads without
``sync_cls_avg_factor``); a difference in a head that is all
MMDetection's code is that upstream behaviour. A difference in a head
with other code (the project's, the user's) is a bug there, when it is
large (:data:`SMALL_DIFFERENCE`; a small one comes from padding or
sampling sized by the local batch, as CO-DINO's auxiliary query groups).

The reference pass runs on rank 0 while the other ranks wait, so it uses
the threads of every rank (``torch.set_num_threads``).
"""
import contextlib
import copy
import inspect
import os
import os.path as osp
import random
from collections import OrderedDict
from typing import Any, Dict, Iterator, List

import torch
import torch.distributed as dist
import torch.nn as nn

from ..utils.ddp_averaging import average_gradients, ranks_with_gradient
from .collectives import single_process_view
from .determinism import split_invariant
from .errors import describe_error

FP32_TOLERANCE = 1e-4
# Above this relative error in a head with code of its own, the
# difference is a count normalised per rank, not a small per-batch effect.
SMALL_DIFFERENCE = 1e-3
PREPROCESS_SEED = 4321


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


def loss_errors(per_rank: List[Dict[str, float]],
                whole: Dict[str, Any]) -> Dict[str, float]:
    """Per loss term, ``|mean over ranks - one process| / |one process|``.
    A term normalised by counts over every rank (or averaged per image)
    has the same mean over the ranks as over the whole batch; one
    normalised by the local count has not."""
    errors = {}
    for key, value in whole.items():
        if not all(key in values for values in per_rank):
            continue
        mean = sum(values[key] for values in per_rank) / len(per_rank)
        errors[key] = abs(mean - float(value)) / max(abs(float(value)), 1e-12)
    return errors


@contextlib.contextmanager
def _preprocessor_from(model, state) -> Iterator[None]:
    """Run ``model`` with a copy of the data preprocessor ``state`` and
    Python's random module seeded alike."""
    kept = model.data_preprocessor
    model.data_preprocessor = copy.deepcopy(state)
    saved = random.getstate()
    random.seed(PREPROCESS_SEED)
    try:
        yield
    finally:
        random.setstate(saved)
        model.data_preprocessor = kept


def library_dirs() -> List[str]:
    """Where MMDetection and the libraries under it live: code there is
    upstream's."""
    import mmcv
    import mmdet
    import mmengine
    return [
        osp.dirname(osp.abspath(m.__file__)) + os.sep
        for m in (mmdet, mmengine, mmcv, torch)
    ]


def loss_heads(model: nn.Module) -> Dict[str, List[nn.Module]]:
    """Top-level modules that compute losses (a ``loss`` method), or lists
    of such modules, by name."""
    heads = {}
    for name, child in model.named_children():
        members = [child] if hasattr(child, 'loss') else [
            c for c in child.children() if hasattr(c, 'loss')
        ] if isinstance(child, (nn.ModuleList, nn.Sequential)) else []
        if members:
            heads[name] = members
    return heads


def head_code(model: nn.Module) -> Dict[str, dict]:
    """For each loss head, its classes and the files outside MMDetection
    and its libraries that define them or the classes they derive from."""
    libraries = tuple(library_dirs())
    found = {}
    for name, members in loss_heads(model).items():
        files = set()
        for member in members:
            for cls in type(member).__mro__:
                try:
                    path = inspect.getsourcefile(cls)
                except TypeError:  # builtins
                    path = None
                if path and not osp.abspath(path).startswith(libraries):
                    files.add(osp.abspath(path))
        found[name] = dict(
            classes=sorted({type(m).__name__ for m in members}),
            files=sorted(files))
    return found


@contextlib.contextmanager
def _all_threads(world_size: int) -> Iterator[None]:
    """Use every rank's share of threads while the others wait."""
    threads = torch.get_num_threads()
    torch.set_num_threads(threads * world_size)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _collated(probe, samples: List[dict]) -> dict:
    """A batch of copies (batch augments edit data samples in place)."""
    return probe.collate(copy.deepcopy(samples))


def _padded_shape(probe, samples: List[dict], state) -> List[int]:
    """Height and width of the batch as the training forward gets it."""
    with _preprocessor_from(probe.model, state), single_process_view():
        inputs = probe.model.data_preprocessor(
            _collated(probe, samples), True)['inputs']
    return list(inputs.shape[-2:])


def compare_gradients(probe) -> Dict[str, Any]:
    """Run on every rank; rank 0's result holds the comparison.

    Every rank makes the same real collectives whatever fails (the
    averaging, the gathering of loss values and errors), as in the probe's
    iterations, so a failure on one rank cannot leave another waiting.
    A failure is returned as ``result['error']`` (:func:`describe_error`).

    Args:
        probe: The rank's probe: ``model``, ``params`` (trainable named
            parameters), ``optim_wrapper``, ``recorder``, ``schedule``,
            ``collate``, ``rank``, ``world_size``, ``side_group``,
            ``forward_loss(batch)`` and ``phase(record, name, fn)``.
    """
    # The same batches on every rank: a failure here is every rank's.
    batches = probe.schedule.equivalence_batches()
    model = probe.model
    result: Dict[str, Any] = dict(
        tolerance=FP32_TOLERANCE,
        small_difference=SMALL_DIFFERENCE,
        box_counts=probe.schedule.box_counts(batches))
    state = copy.deepcopy(model.data_preprocessor)
    record: Dict[str, Any] = dict(error=None)
    values: Dict[str, float] = {}

    def forward():
        _, loss, log_vars = probe.forward_loss(
            _collated(probe, batches[probe.rank]))
        values.update({k: float(v) for k, v in log_vars.items()})
        record['loss'] = loss

    with split_invariant(model):
        probe.optim_wrapper.zero_grad()
        probe.recorder.start_iteration()
        with _preprocessor_from(model, state):
            probe.phase(record, 'forward', forward)
            probe.phase(record, 'backward',
                        lambda: record.pop('loss').backward())
        params = [p for _, p in probe.params]
        counts = ranks_with_gradient(params)
        average_gradients([p for p, c in zip(params, counts) if c])
        result['diverged'] = probe.recorder.divergence is not None
        gathered: List[Any] = [None] * probe.world_size
        dist.all_gather_object(
            gathered, (values, record['error']), group=probe.side_group)
        errors = [error for _, error in gathered if error is not None]
        if errors:
            result['error'] = errors[0]
        elif probe.rank == 0:
            try:
                result.update(
                    _reference(probe, batches, state,
                               [v for v, _ in gathered]))
            except Exception as error:  # the report says what failed
                result['error'] = describe_error(
                    error, 'gradient comparison (one process)')
        probe.optim_wrapper.zero_grad()
    return result


def _reference(probe, batches: List[List[dict]], state,
               rank_values: List[Dict[str, float]]) -> Dict[str, Any]:
    """Rank 0 alone: one process over every rank's images, against the
    ranks' averaged gradient and loss values."""
    model = probe.model
    averaged = _grads(probe.params)
    probe.optim_wrapper.zero_grad()
    whole = [s for b in batches for s in b]
    with _preprocessor_from(model, state), single_process_view(), \
            _all_threads(probe.world_size):
        _, loss, log_vars = probe.forward_loss(_collated(probe, whole))
        loss.backward()
    return dict(
        head_code=head_code(model),
        relative_error=relative_errors(averaged, _grads(probe.params)),
        loss_error=loss_errors(rank_values, log_vars),
        padded_shapes=dict(
            ranks=[_padded_shape(probe, b, state) for b in batches],
            whole=_padded_shape(probe, whole, state)))
