from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
from mmengine.logging import print_log
from mmengine.model import MMDistributedDataParallel
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from ..utils.dist_env import ddp_device_ids

MAX_LOGGED_GROUPS = 8


def group_param_names(names: Sequence[str],
                      max_groups: int = MAX_LOGGED_GROUPS) -> str:
    """``'head.{a,b}, neck.w (+3 more modules)'``: names grouped by their
    owning module, truncated to ``max_groups`` modules."""
    groups: Dict[str, List[str]] = OrderedDict()
    for name in names:
        prefix, _, leaf = name.rpartition('.')
        groups.setdefault(prefix, []).append(leaf)
    parts = []
    for prefix, leaves in list(groups.items())[:max_groups]:
        leaf = leaves[0] if len(leaves) == 1 else '{' + ','.join(leaves) + '}'
        parts.append(f'{prefix}.{leaf}' if prefix else leaf)
    if len(groups) > max_groups:
        parts.append(f'(+{len(groups) - max_groups} more modules)')
    return ', '.join(parts)


class UnexpectedUnusedParameterError(RuntimeError):
    """A parameter went unused on the fast path, where DDP would hang."""


@MODEL_WRAPPERS.register_module()
class AutoDDP(MMDistributedDataParallel):
    """``MMDistributedDataParallel`` that works out ``find_unused_parameters``.

    ``model_wrapper_cfg = dict(type='AutoDDP')``. With the flag left unset,
    the first optimizer step is a probe: the model runs without DDP,
    gradients are averaged across ranks by one flat all-reduce (with DDP's
    semantics: a parameter used on some rank gets the average with zeros
    from the others; one used on no rank keeps ``grad is None``), and the
    ranks combine which trainable parameters received a gradient. DDP is
    then built in the cheapest correct mode and one line is logged:

    - every parameter used on every rank: ``find_unused_parameters=False``,
      exactly DDP's fast path;
    - some parameters used on no rank (a layer added to a head but not wired
      into the loss): those are excluded from DDP
      (``_ddp_params_and_buffers_to_ignore``) and the rest runs on the fast
      path, with no per-iteration graph traversal. Should an excluded
      parameter receive a gradient later, its gradient is averaged across
      ranks on the spot (one small all-reduce of a usage mask per step
      decides), so replicas never diverge;
    - some parameters used on some ranks only: ``find_unused_parameters=True``.

    On the fast path, a parameter that goes unused later on some rank would
    make DDP hang or fail with "Expected to have finished reduction". AutoDDP
    checks at the end of every backward, before DDP finalises, and stops
    that rank with :class:`UnexpectedUnusedParameterError` naming the
    parameters and the config to set.

    The decision is kept in :attr:`autoddp_decision` (read by
    ``CheckpointConflictHook``).

    Args:
        module (nn.Module): Model to wrap.
        find_unused_parameters (bool, optional): ``None`` (default) lets
            AutoDDP decide. ``True``/``False`` are honoured as given, and one
            line is logged if the first step shows a different need.
        detect_anomalous_params (bool): As in ``MMDistributedDataParallel``.
            Defaults to False.
        **kwargs: Other ``DistributedDataParallel`` arguments, unchanged.
            ``device_ids``/``output_device`` are dropped for a module that is
            not on a CUDA device (DDP refuses them there).
    """

    def __init__(self,
                 module: nn.Module,
                 find_unused_parameters: Optional[bool] = None,
                 detect_anomalous_params: bool = False,
                 **kwargs):
        if find_unused_parameters not in (None, True, False):
            raise TypeError(
                'AutoDDP: find_unused_parameters must be None (decide '
                'automatically), True or False, but got '
                f'{find_unused_parameters!r}.')
        if ddp_device_ids(module) is None:
            kwargs.pop('device_ids', None)
            kwargs.pop('output_device', None)
        self._user_flag = find_unused_parameters
        if find_unused_parameters is None:
            # DDP is built after the probe step; until then this object is a
            # plain module holding the model (val/test steps work as usual).
            nn.Module.__init__(self)
            self.module = module
            self.detect_anomalous_params = detect_anomalous_params
            self._ddp_kwargs = kwargs
            self._ddp_built = False
        else:
            super().__init__(
                module,
                detect_anomalous_params=detect_anomalous_params,
                find_unused_parameters=find_unused_parameters,
                **kwargs)
            self._ddp_built = True
        self._ignored: List[Tuple[str, nn.Parameter]] = []
        # Parameters that must get a local gradient every step (fast path).
        self._checked: List[Tuple[str, nn.Parameter]] = (
            self._trainable() if find_unused_parameters is False else [])
        self._observe_first_step = find_unused_parameters is not None
        self._local_unused: List[str] = []
        self.autoddp_decision: Optional[dict] = None

    # ------------------------------------------------------------------ api
    def train_step(self, data: Union[dict, tuple, list],
                   optim_wrapper: OptimWrapper) -> Dict[str, torch.Tensor]:
        """Differs from ``MMDistributedDataParallel.train_step`` in running
        the first step as a probe (no DDP yet) when the flag is unset, and in
        hooking the loss so that a check runs at the end of its backward."""
        probing = not self._ddp_built
        model = self.module if probing else self
        with optim_wrapper.optim_context(model):
            data = self.module.data_preprocessor(data, training=True)
            if probing:
                self._broadcast_module_states()
                losses = self.module._run_forward(data, mode='loss')
            else:
                losses = self._run_forward(data, mode='loss')
        parsed_loss, log_vars = self.module.parse_losses(losses)
        syncs = getattr(optim_wrapper, 'should_sync', lambda: True)()
        if parsed_loss.requires_grad:
            callback = self._probe_sync if probing else self._check_usage
            self._run_at_end_of_backward(parsed_loss, callback, syncs)
        optim_wrapper.update_params(parsed_loss)
        if self.detect_anomalous_params and not probing:
            from mmengine.model.utils import detect_anomalous_params
            detect_anomalous_params(parsed_loss, model=self)
        if probing and syncs:
            self._build_ddp()
        elif self._observe_first_step and syncs:
            self._report_observation()
        return log_vars

    # ------------------------------------------------------------ internals
    @staticmethod
    def _run_at_end_of_backward(loss: torch.Tensor, callback,
                                syncs: bool) -> None:
        """Queue ``callback`` to run when the backward of ``loss`` ends.

        The hook on the loss fires first in its backward, so the callback is
        queued before DDP's own finalisation and sees the local gradients.
        """

        def queue(grad):
            if syncs:
                torch.autograd.Variable._execution_engine.queue_callback(
                    callback)
            return grad

        loss.register_hook(queue)

    def _trainable(self) -> List[Tuple[str, nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters()
                if p.requires_grad]

    def _broadcast_module_states(self) -> None:
        """Start from rank 0's weights, as ``DistributedDataParallel``'s
        constructor does (the probe runs before it)."""
        with torch.no_grad():
            for tensor in list(self.module.parameters()) + list(
                    self.module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def _average_grads(self, params: List[nn.Parameter]) -> None:
        """Average ``params``' gradients across ranks like DDP: missing ones
        count as zeros, each is divided by the world size before the sum."""
        if not params:
            return
        world_size = dist.get_world_size()
        by_dtype: Dict[torch.dtype, List[torch.Tensor]] = OrderedDict()
        for param in params:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            by_dtype.setdefault(param.grad.dtype, []).append(param.grad)
        for grads in by_dtype.values():
            flat = _flatten_dense_tensors(grads).div_(world_size)
            dist.all_reduce(flat)
            for grad, synced in zip(grads,
                                    _unflatten_dense_tensors(flat, grads)):
                grad.copy_(synced)

    def _ranks_using(self, params: List[nn.Parameter]) -> List[int]:
        """For each parameter, on how many ranks it has a gradient."""
        device = params[0].device
        used = torch.tensor([p.grad is not None for p in params],
                            dtype=torch.int32,
                            device=device)
        dist.all_reduce(used)
        return used.tolist()

    def _probe_sync(self) -> None:
        trainable = self._trainable()
        counts = self._ranks_using([p for _, p in trainable])
        self._average_grads([p for (_, p), c in zip(trainable, counts) if c])
        self._probe_counts = counts

    def _build_ddp(self) -> None:
        trainable = self._trainable()
        world_size = dist.get_world_size()
        never = [n for (n, _), c in zip(trainable, self._probe_counts)
                 if c == 0]
        partial = [
            n for (n, _), c in zip(trainable, self._probe_counts)
            if 0 < c < world_size
        ]
        module, kwargs = self.module, self._ddp_kwargs
        if partial:
            find_unused = True
            why = (f'{len(partial)} parameter(s) received gradients on some '
                   f'ranks only: {group_param_names(partial)}')
            mode = 'find_unused'
        elif never:
            find_unused = False
            ignored = set(never)
            already = getattr(module, '_ddp_params_and_buffers_to_ignore', ())
            ddp_cls = DistributedDataParallel
            ddp_cls._set_params_and_buffers_to_ignore_for_model(
                module, sorted(ignored | set(already)))
            self_ignored = [(n, p) for n, p in trainable if n in ignored]
            why = (f'{len(never)} parameter(s) received no gradient on any '
                   f'rank and are left out of DDP (their grad stays None; '
                   f'synced on the spot if one is ever used): '
                   f'{group_param_names(never)}')
            mode = 'ignore_unused'
        else:
            find_unused = False
            why = 'every trainable parameter received a gradient on every rank'
            mode = 'static'
        detect = self.detect_anomalous_params
        super().__init__(
            module,
            detect_anomalous_params=detect,
            find_unused_parameters=find_unused,
            **kwargs)
        self._ddp_built = True
        if mode == 'ignore_unused':
            self._ignored = self_ignored
        if not find_unused:
            ignored_names = {n for n, _ in self._ignored}
            self._checked = [(n, p) for n, p in trainable
                             if n not in ignored_names]
        self.autoddp_decision = dict(
            mode=mode,
            find_unused_parameters=find_unused,
            ignored=list(never) if mode == 'ignore_unused' else [],
            partially_used=partial,
            never_used=never,
            reason=why)
        print_log(
            f'AutoDDP: find_unused_parameters={find_unused} ({mode}): {why}.',
            logger='current')

    def _check_usage(self) -> None:
        """End-of-backward check on the fast path.

        Runs before DDP finalises the backward. A checked parameter without
        a local gradient means DDP's buckets cannot complete on this rank:
        stop here with a clear message rather than hang the peers. Excluded
        parameters that did get a gradient somewhere are averaged now.
        """
        if not self.require_backward_grad_sync:
            return
        missing = [n for n, p in self._checked if p.grad is None]
        if self._observe_first_step:
            self._local_unused = [
                n for n, p in self._trainable() if p.grad is None
            ]
            if self._user_flag:
                return
        if missing:
            raise UnexpectedUnusedParameterError(
                f'AutoDDP (rank {dist.get_rank()}): {len(missing)} '
                'parameter(s) received no gradient in this iteration, but '
                'DDP runs with find_unused_parameters=False, where every '
                'parameter must be used on every rank: '
                f'{group_param_names(missing)}. '
                'Set model_wrapper_cfg=dict(type=\'AutoDDP\', '
                'find_unused_parameters=True) in the config to train with '
                'parameters that are used only on some iterations or ranks.')
        if self._ignored:
            params = [p for _, p in self._ignored]
            counts = self._ranks_using(params)
            woke = [(n, p) for (n, p), c in zip(self._ignored, counts) if c]
            if woke:
                self._average_grads([p for _, p in woke])
                print_log(
                    'AutoDDP: parameters left out of DDP received gradients '
                    'and were averaged across ranks: '
                    f'{group_param_names([n for n, _ in woke])}',
                    logger='current',
                    level=30)

    def _report_observation(self) -> None:
        """With a user-set flag: compare it with what the first step
        needed and log one line if they disagree."""
        self._observe_first_step = False
        trainable = self._trainable()
        local = set(self._local_unused)
        device = trainable[0][1].device if trainable else 'cpu'
        unused = torch.tensor([n in local for n, _ in trainable],
                              dtype=torch.int32,
                              device=device)
        dist.all_reduce(unused)
        unused_names = [n for (n, _), c in zip(trainable, unused.tolist())
                        if c]
        if self._user_flag and not unused_names:
            print_log(
                'AutoDDP: find_unused_parameters=True was set, but every '
                'trainable parameter received a gradient on every rank in '
                'the first step; leaving it unset would run the faster '
                'find_unused_parameters=False path.',
                logger='current',
                level=30)
        self.autoddp_decision = dict(
            mode='user',
            find_unused_parameters=bool(self._user_flag),
            ignored=[],
            partially_used=[],
            never_used=unused_names,
            reason='set in model_wrapper_cfg')
