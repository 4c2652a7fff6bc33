import copy
import inspect
import logging
from typing import Dict, List, Optional, Union

import torch.distributed as dist
import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import (all_gather_object, get_rank, get_world_size,
                           is_distributed)
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS, MODEL_WRAPPERS, RUNNERS
from mmengine.runner import Runner
from torch.nn.parallel import DistributedDataParallel

from ..hooks.rank_status_hook import RankStatusHook, read_rank_status
from ..hooks.safe_checkpoint_hook import SafeCheckpointHook
from ..utils.checkpoint_safety import safe_checkpoint_loading
from ..utils.class_count_check import check_class_counts
from ..utils.dist_env import (check_launch_environment, init_distributed,
                              rank_device)
from ..wrappers.auto_ddp import UnexpectedUnusedParameterError
from ..wrappers.auto_ddp_restart import keep_need_for_restart

# mmddp_ext_cfg keys and their values when the key is absent.
EXT_CFG_DEFAULTS = dict(
    auto_ddp=False,
    checkpoint_conflict=None,
    empty_gt_guard=None,
    empty_gt_stats=False,
    finite_predictions=True,
    rank_consistency=None,
)
# AmpOptimWrapper keys a plain OptimWrapper does not take.
AMP_ONLY_KEYS = ('loss_scale', 'dtype', 'use_fsdp')
_TIMEOUT_WORDS = ('timed out', 'timeout', 'connection closed by peer')


@RUNNERS.register_module()
class ExtRunner(Runner):
    """MMEngine ``Runner`` that launches on CPU or GPU, resumes safely and
    switches on the mmddp_ext stack.

    Select it with ``runner_type = 'ExtRunner'`` (``tools/train.py`` and
    ``configs/_base_/mmddp_ext.py`` do). It differs from ``Runner`` in
    these methods, each calling ``super()`` for everything else:

    - ``setup_env``: refuses doubled process management
      (:func:`~mmddp_ext.utils.dist_env.check_launch_environment`) and
      initialises the process group through
      :func:`~mmddp_ext.utils.dist_env.init_distributed`: gloo when NCCL
      cannot run, a CUDA device only when there is one, and a bounded
      collective timeout (300 s unless ``env_cfg.dist_cfg.timeout`` says
      otherwise).
    - ``wrap_model``: passes ``device_ids`` to a DDP wrapper only for a
      model on a CUDA device (stock passes ``[LOCAL_RANK]`` always), and
      uses ``AutoDDP`` when no wrapper is configured and
      ``mmddp_ext_cfg.auto_ddp`` is on. ``sync_bn`` is skipped, with a
      warning, on CPU ranks: torch's ``SyncBatchNorm`` runs on GPUs only,
      so stock converts the model and its first forward raises.
    - ``build_optim_wrapper``: an ``AmpOptimWrapper`` becomes a plain
      ``OptimWrapper``, with a warning, when no accelerator is there (CPU
      ranks, a laptop): MMEngine's AMP wrapper refuses to start on CPU, so
      a GPU recipe with AMP (RT-DETRv2, D-FINE, DEIM) could not be tried
      or debugged there. It applies again on GPUs.
    - ``__init__``: before anything is built, checks every ``num_classes``
      in the model config against the classes of each dataloader's dataset
      (:func:`~mmddp_ext.utils.class_count_check.check_class_counts`);
      under a launcher every rank raises the error together in
      ``setup_env``, right after the process group is up.
    - ``dump_config``: adds ``'mmddp_ext'`` to ``custom_imports`` (keeping
      the config's own imports) before dumping, so that the dumped config
      reloads in a fresh interpreter, e.g. with MMDetection's own
      ``tools/test.py``, and finds ``runner_type='ExtRunner'``.
    - ``register_hooks``: adds :class:`SafeCheckpointHook` (checkpoints hold
      only tensors and plain types), :class:`RankStatusHook`, and the hooks
      that ``mmddp_ext_cfg`` switches on, unless the config lists them.
    - ``load_checkpoint``: reads local files with ``weights_only=True``.
    - ``train``: when a collective times out, re-raises with every rank's
      last reported iteration and phase; when AutoDDP stops every rank for
      parameters gone unused, records in the latest checkpoint that the
      run needs ``find_unused_parameters=True`` (so a restart resumes that
      way).

    Config keys it reads besides ``Runner``'s:

    - trusted_checkpoints (list[str]): Checkpoint paths that may be loaded
      with ``weights_only=False`` if the safe load refuses them (files from
      stock MMEngine). Defaults to ``[]``.
    - mmddp_ext_cfg (dict): Which parts of the stack to switch on; the
      keys, all off by default but ``finite_predictions``
      (``configs/_base_/mmddp_ext.py`` turns them on):

      - auto_ddp (bool): ``model_wrapper_cfg`` defaults to
        ``dict(type='AutoDDP')``; a top-level ``find_unused_parameters``
        key is passed on to it as the user's explicit choice.
      - checkpoint_conflict (str | None): ``CheckpointConflictHook``
        policy (``'non_reentrant'``, ``'disable'``, ``'error'``).
      - empty_gt_guard (dict | None): keyword arguments of
        ``empty_gt_guard_collate``, used as ``train_dataloader.collate_fn``
        when the train dataloader names no collate function.
      - empty_gt_stats (bool): register ``EmptyGTStatsHook``.
      - finite_predictions (bool): register ``FinitePredictionsHook``, so
        that predictions with NaN/inf boxes or scores are scored as misses
        in validation and testing (a diverged or uninitialised model
        scores mAP 0, not the mAP above 0 that COCO evaluation gives NaN
        boxes) and a warning says how many there were. Defaults to True
        (the only key on without the base file: it changes no finite
        prediction).
      - rank_consistency (dict | None): keyword arguments of
        ``RankConsistencyHook``.
    """

    def __init__(self, *args, **kwargs):
        self._check_class_counts(*args, **kwargs)
        super().__init__(*args, **kwargs)
        guard = self.ext_cfg['empty_gt_guard']
        loader = self._train_dataloader
        if (guard is not None and isinstance(loader, dict)
                and loader.get('collate_fn') is None):
            self._train_dataloader = dict(
                loader,
                collate_fn=dict(type='empty_gt_guard_collate', **guard))

    @property
    def ext_cfg(self) -> dict:
        """``mmddp_ext_cfg`` from the config, checked, with defaults."""
        given = self.cfg.get('mmddp_ext_cfg') or {}
        if not isinstance(given, dict):
            raise TypeError('mmddp_ext_cfg must be a dict, but got '
                            f'{type(given).__name__}.')
        unknown = sorted(set(given) - set(EXT_CFG_DEFAULTS))
        if unknown:
            raise ValueError(
                f'mmddp_ext_cfg has unknown key(s) {unknown}; accepted keys '
                f'are {sorted(EXT_CFG_DEFAULTS)}.')
        return dict(EXT_CFG_DEFAULTS, **given)

    def _check_class_counts(self, *args, **kwargs) -> None:
        """Run the class-count check on ``Runner.__init__``'s ``model`` and
        dataloader arguments (by position or name) before anything is built.

        Without a launcher the ``ValueError`` is raised here. Under a
        launcher it is kept for :meth:`_raise_class_count_error_together`:
        a rank that raised alone could be killed by torchrun before its
        peers print the message, leaving their logs without the reason.
        """
        given = inspect.signature(Runner.__init__).bind_partial(
            None, *args, **kwargs).arguments
        self._class_count_error = None
        try:
            check_class_counts(
                given.get('model'), {
                    f'{split}_dataloader': given.get(f'{split}_dataloader')
                    for split in ('train', 'val', 'test')
                },
                scope=given.get('default_scope', 'mmengine'))
        except ValueError as error:
            if given.get('launcher', 'none') == 'none':
                raise
            self._class_count_error = str(error)

    def _raise_class_count_error_together(self) -> None:
        """Raise the class-count error on every rank at once, once the
        process group is up (every rank reads the same config, so they
        normally all fail; a rank whose own check passed reports a peer's).
        """
        errors = [self._class_count_error]
        if self.distributed:
            errors = all_gather_object(self._class_count_error)
        failed = [(rank, text) for rank, text in enumerate(errors) if text]
        if failed:
            rank, text = failed[0]
            raise ValueError(f'rank {get_rank()} of {get_world_size()} '
                             f'stops (rank {rank} found it): {text}')

    def dump_config(self) -> None:
        self._import_mmddp_ext_in_cfg()
        super().dump_config()

    def _import_mmddp_ext_in_cfg(self) -> None:
        """Add ``'mmddp_ext'`` to ``self.cfg.custom_imports``.

        ``configs/_base_/mmddp_ext.py`` imports mmddp_ext through an
        expression, which the dumped config does not keep, and it sets no
        ``custom_imports`` itself because most configs with their own
        modules set that key (MMEngine refuses a key set by two bases).
        The user's imports and ``allow_failed_imports`` stay as they are.
        """
        custom_imports = dict(self.cfg.get('custom_imports') or {})
        imports = custom_imports.get('imports', [])
        imports = [imports] if isinstance(imports, str) else list(imports)
        if 'mmddp_ext' not in imports:
            imports.append('mmddp_ext')
        custom_imports['imports'] = imports
        custom_imports.setdefault('allow_failed_imports', False)
        self.cfg.custom_imports = custom_imports

    def setup_env(self, env_cfg: Dict) -> None:
        if self.distributed and not is_distributed():
            # init_distributed runs the launch checks itself.
            init_distributed(self.launcher,
                             **copy.deepcopy(env_cfg.get('dist_cfg', {})))
        else:
            check_launch_environment(self.launcher)
        self._raise_class_count_error_together()
        super().setup_env(env_cfg)

    def wrap_model(self, model_wrapper_cfg: Optional[Dict],
                   model: nn.Module) -> nn.Module:
        if not self.distributed or is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        find_unused = self.cfg.get('find_unused_parameters', None)
        if model_wrapper_cfg is None and self.ext_cfg['auto_ddp']:
            model_wrapper_cfg = dict(
                type='AutoDDP',
                broadcast_buffers=False,
                find_unused_parameters=find_unused)
        elif model_wrapper_cfg is None:
            # The arguments stock Runner uses when no wrapper is configured.
            model_wrapper_cfg = dict(
                type='MMDistributedDataParallel',
                broadcast_buffers=False,
                find_unused_parameters=bool(find_unused))
        if self.cfg.get('sync_bn', None) is not None and get_device() == 'cpu':
            print_log(
                f'ExtRunner: sync_bn={self.cfg.sync_bn!r} skipped: torch\'s '
                'SyncBatchNorm runs on GPUs only, so each CPU rank keeps its '
                'own BatchNorm statistics (as with sync_bn unset). It '
                'applies again on GPU ranks.',
                logger='current',
                level=logging.WARNING)
            self.cfg.sync_bn = None
        model_wrapper_cfg = copy.deepcopy(dict(model_wrapper_cfg))
        model_wrapper_cfg.setdefault('type', 'MMDistributedDataParallel')
        wrapper_type = MODEL_WRAPPERS.get(model_wrapper_cfg['type'])
        if isinstance(wrapper_type, type) and issubclass(
                wrapper_type, DistributedDataParallel):
            device = rank_device() if get_device() != 'cpu' else None
            model_wrapper_cfg.setdefault(
                'device_ids', None if device is None else [device.index])
        return super().wrap_model(model_wrapper_cfg, model)

    def build_optim_wrapper(self, optim_wrapper):
        """``Runner.build_optim_wrapper``, with AMP dropped on CPU (see the
        class doc); a built wrapper or a config for another type is passed
        on unchanged."""
        if (isinstance(optim_wrapper, dict)
                and optim_wrapper.get('type') == 'AmpOptimWrapper'
                and get_device() == 'cpu'):
            print_log(
                'ExtRunner: optim_wrapper AmpOptimWrapper runs as a plain '
                'OptimWrapper (fp32): MMEngine\'s AMP needs a GPU (or NPU, '
                'MLU, MUSA) and none is here. It applies again on GPUs.',
                logger='current',
                level=logging.WARNING)
            optim_wrapper = copy.deepcopy(dict(optim_wrapper))
            optim_wrapper['type'] = 'OptimWrapper'
            for key in AMP_ONLY_KEYS:
                optim_wrapper.pop(key, None)
        return super().build_optim_wrapper(optim_wrapper)

    def register_hooks(
            self,
            default_hooks: Optional[Dict[str, Union[Hook, Dict]]] = None,
            custom_hooks: Optional[List[Union[Hook, Dict]]] = None) -> None:
        super().register_hooks(default_hooks, custom_hooks)
        ext = self.ext_cfg
        wanted = [(SafeCheckpointHook, {}), (RankStatusHook, {})]
        if ext['checkpoint_conflict'] is not None:
            wanted.append(('CheckpointConflictHook',
                           dict(policy=ext['checkpoint_conflict'])))
        if ext['empty_gt_stats']:
            wanted.append(('EmptyGTStatsHook', {}))
        if not isinstance(ext['finite_predictions'], bool):
            raise TypeError(
                'mmddp_ext_cfg.finite_predictions must be True (score '
                'non-finite predictions as misses) or False (stock '
                'evaluation), but got '
                f'{ext["finite_predictions"]!r} '
                f'({type(ext["finite_predictions"]).__name__}).')
        if ext['finite_predictions']:
            wanted.append(('FinitePredictionsHook', {}))
        if ext['rank_consistency'] is not None:
            wanted.append(('RankConsistencyHook',
                           dict(ext['rank_consistency'])))
        for hook_type, kwargs in wanted:
            cls = HOOKS.get(hook_type) if isinstance(hook_type,
                                                     str) else hook_type
            if cls is None:
                raise ValueError(
                    f'mmddp_ext_cfg switches on {hook_type}, which is not '
                    'registered; is mmddp_ext up to date?')
            if not any(isinstance(h, cls) for h in self._hooks):
                self.register_hook(cls(**kwargs))

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with safe_checkpoint_loading(self.cfg.get('trusted_checkpoints')):
            return super().load_checkpoint(filename, *args, **kwargs)

    def train(self) -> nn.Module:
        try:
            return super().train()
        except UnexpectedUnusedParameterError as error:
            # Every rank raised it; a torchrun restart resumes correctly.
            keep_need_for_restart(self, error)
            raise
        except RuntimeError as error:
            text = str(error).lower()
            if not (self.distributed and dist.is_initialized() and any(
                    word in text for word in _TIMEOUT_WORDS)):
                raise
            status = read_rank_status(self.world_size)
            lines = '; '.join(f'rank {r}: {s}' for r, s in status.items())
            raise RuntimeError(
                f'mmddp_ext: a collective failed on rank {self.rank} '
                f'({str(error).splitlines()[0][:200]}). Last known state of '
                f'each rank: {lines or "unavailable"}. A rank that is behind '
                'or stuck in another phase usually ran different code '
                '(different loss keys, a skipped branch, an extra '
                'collective); see that rank\'s log. The timeout is '
                'env_cfg.dist_cfg.timeout (seconds).') from error
