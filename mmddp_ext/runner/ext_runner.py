import copy
import inspect
import logging
import os
import os.path as osp
from dataclasses import asdict, replace
from typing import Dict, List, Optional, Tuple, Union

import torch.distributed as dist
import torch.nn as nn
from mmengine.device import get_device
from mmengine.dist import (all_gather_object, broadcast_object_list, get_rank,
                           get_world_size, is_distributed)
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS, RUNNERS
from mmengine.runner import Runner

from ..hooks.preemption_hook import Preempted
from ..hooks.rank_status_hook import read_rank_status
from ..launch.peer_watchdog import announce_planned_exit
from ..launch.process_group import (check_launch_environment, init_distributed,
                                    rank_device)
from ..utils.checkpoint_safety import safe_checkpoint_loading
from ..utils.class_count_check import check_class_counts
from ..utils.precision import resolve_precision
from ..utils.run_record import read_record, write_record
from ..utils.text import log_on_every_rank
from ..utils.torch_private import stop_loader_workers
from ..wrappers.auto_ddp import (DECISION_INFO_KEY, AutoDDP,
                                 UnexpectedUnusedParameterError)
from ..wrappers.auto_ddp_restart import (forget_need, keep_need_for_restart,
                                         read_need)
from .ddp_setup import resolve_ddp_setup
from .exact_resume import (position_meta, prepare_loop, resumable_loader_cfg,
                           resumable_loop_cfg, resume_data)
from .ext_cfg import checked_ext_cfg, ext_hooks, train_collate_cfg
from .formatted_once_config import FormattedOnceConfig
from .start_point import (RECORD, StartPoint, check_resume, checkpoint_damage,
                          checkpoint_stamp, choose_start,
                          newest_whole_checkpoint, peek_is_training_checkpoint,
                          restart_count)

_TIMEOUT_WORDS = ('timed out', 'timeout', 'connection closed by peer')


def _shows(logger: logging.Logger, level: int) -> bool:
    """Whether a record of ``level`` reaches a handler that emits it:
    ``logger``'s handlers, then its ancestors' while records propagate
    (the standard library's own walk, with handler levels)."""
    if not logger.isEnabledFor(level):
        return False
    node = logger
    while node is not None:
        if any(level >= handler.level for handler in node.handlers):
            return True
        node = node.parent if node.propagate else None
    return False


@RUNNERS.register_module()
class ExtRunner(Runner):
    """MMEngine ``Runner`` that launches on CPU or GPU (torchrun or Slurm),
    resumes exactly and switches on the mmddp_ext stack.

    A drop-in for ``Runner`` (``runner_type = 'ExtRunner'``; the tools and
    ``configs/_base_/mmddp_ext.py`` set it). Overridden, each calling
    ``super()`` for the rest:

    - ``__init__``, ``_log_env``, ``dump_config``: the config formatted
      once; the class-count check first; ``'mmddp_ext'`` in the dump.
    - ``setup_env``, ``wrap_model``, ``build_optim_wrapper``: launch checks,
      gloo or NCCL with a bounded timeout, the DDP set-up and AMP recipes
      as :mod:`~mmddp_ext.runner.ddp_setup` and
      :mod:`~mmddp_ext.utils.precision` rule.
    - ``register_hooks``: :func:`~mmddp_ext.runner.ext_cfg.ext_hooks`.
    - ``build_train_loop``, ``save_checkpoint``, ``load_checkpoint``:
      resumable loops, atomic weights-only checkpoints with the position.
    - ``load_or_resume``, ``train``, ``val``, ``test``: one start rule for
      every launch, restart, requeue and resume; a timed-out collective
      names each rank's phase; a planned end tells the peer watchdog.

    Config keys besides ``Runner``'s: ``resume`` (also ``'auto'``),
    ``trusted_checkpoints`` and ``mmddp_ext_cfg`` (defaults in
    :data:`~mmddp_ext.runner.ext_cfg.EXT_CFG_DEFAULTS`); docs/design.md
    and docs/cluster.md have each method and key.
    """

    # ext_cfg.opted_in: this runner, and every runner derived from it,
    # reads mmddp_ext_cfg.
    reads_mmddp_ext_cfg = True

    def __init__(self, *args, **kwargs):
        self._check_class_counts(*args, **kwargs)
        given = inspect.signature(Runner.__init__).bind_partial(
            None, *args, **kwargs)
        if given.arguments.get('cfg') is not None:
            given.arguments['cfg'] = FormattedOnceConfig.of(
                given.arguments['cfg'])
        super().__init__(*given.args[1:], **given.kwargs)
        loader = self._train_dataloader
        if isinstance(loader, dict):
            collate = train_collate_cfg(loader, self.ext_cfg)
            if collate is not loader.get('collate_fn'):
                self._train_dataloader = dict(loader, collate_fn=collate)
        if self.ext_cfg['exact_resume'] and isinstance(self._train_loop, dict):
            self._train_loop = resumable_loop_cfg(self._train_loop)
            self._train_dataloader = resumable_loader_cfg(
                self._train_dataloader)
        self._loaded_meta: Optional[dict] = None

    @property
    def ext_cfg(self) -> dict:
        """``mmddp_ext_cfg`` from the config, checked, with defaults."""
        return checked_ext_cfg(self.cfg.get('mmddp_ext_cfg'))

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

    def _log_env(self, env_cfg: dict) -> None:
        """Log the environment and the config where a handler shows them.

        Differs from ``Runner._log_env`` only on a rank whose logger would
        drop both INFO records (MMEngine's logger on a rank other than 0,
        below ``log_level='DEBUG'``: its stream shows errors only and it
        has no file): there nothing is built, where ``Runner`` formats the
        whole config with yapf (0.4 to 1.2 s for a detector config on a
        2-core CPU) and collects the environment for records no handler
        writes, on every such rank of every launch and restart. And the
        config it logs already has ``'mmddp_ext'`` in ``custom_imports``,
        as the visualizer's copy and the dump (``Runner`` calls the three
        in this order), so rank 0 formats one text for all three.
        """
        self._import_mmddp_ext_in_cfg()
        if _shows(self.logger, logging.INFO):
            super()._log_env(env_cfg)

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
        """Differs from ``Runner.wrap_model`` in a distributed run: the
        wrapper config, its ``device_ids`` (None on CPU ranks, where stock
        passes ``[LOCAL_RANK]`` and DDP refuses it) and ``sync_bn`` are
        :func:`~mmddp_ext.runner.ddp_setup.resolve_ddp_setup`'s; ``sync_bn``
        is skipped on CPU ranks with a warning."""
        if not self.distributed or is_model_wrapper(model):
            return super().wrap_model(model_wrapper_cfg, model)
        setup = resolve_ddp_setup(
            self.cfg,
            self.ext_cfg,
            device=rank_device() if get_device() == 'cuda' else get_device(),
            model_wrapper_cfg=model_wrapper_cfg)
        if setup.sync_bn_skipped:
            print_log(
                f'ExtRunner: sync_bn={self.cfg.sync_bn!r} skipped: torch\'s '
                'SyncBatchNorm runs on GPUs only, so each CPU rank keeps its '
                'own BatchNorm statistics (as with sync_bn unset). It '
                'applies again on GPU ranks.',
                logger='current',
                level=logging.WARNING)
            self.cfg.sync_bn = None
        return super().wrap_model(setup.wrapper_cfg, model)

    def build_train_loop(self, loop):
        """``Runner.build_train_loop``; a resumable loop's samples are
        seeded by key (:func:`~.exact_resume.prepare_loop`)."""
        loop = super().build_train_loop(loop)
        prepare_loop(loop, self.seed)
        return loop

    def save_checkpoint(self, out_dir: str, filename: str, *args,
                        **kwargs) -> None:
        """Differs from ``Runner.save_checkpoint``: ``meta`` also holds
        the position an exact resume continues from
        (:func:`~.exact_resume.position_meta`), and a local file is written
        under a temporary name and renamed once whole (removed when the
        save fails), so a process killed during the save never leaves a
        truncated checkpoint under the name ``last_checkpoint`` points to
        (and a resume passes over one that another cause cut short, such
        as a node lost before the file's data reached the disk:
        :meth:`load_or_resume`)."""
        given = inspect.signature(Runner.save_checkpoint).bind(
            self, out_dir, filename, *args, **kwargs)
        given.apply_defaults()
        arguments = given.arguments
        by_epoch = arguments['by_epoch']
        meta = dict(arguments['meta'] or {})
        meta.setdefault('epoch', self.epoch + 1 if by_epoch else self.epoch)
        meta.setdefault('iter', self.iter if by_epoch else self.iter + 1)
        if self._train_loop is not None and not isinstance(
                self._train_loop, dict):
            meta = position_meta(self.train_loop, meta, meta['epoch'],
                                 meta['iter'])
        arguments['meta'] = meta
        local = (
            osp.isdir(out_dir) and arguments['file_client_args'] is None
            and arguments['backend_args'] is None)
        if local:
            arguments['filename'] = f'.{filename}.partial'
        partial = osp.join(out_dir, arguments['filename'])
        try:
            super().save_checkpoint(*given.args[1:], **given.kwargs)
        except BaseException:
            # A save that failed (a full disk) frees what it wrote, so that
            # the resumed run has the room to save again.
            if local and self.rank == 0 and osp.exists(partial):
                os.remove(partial)
            raise
        if local and self.rank == 0:
            os.replace(partial, osp.join(out_dir, filename))

    def build_optim_wrapper(self, optim_wrapper):
        """Differs from ``Runner.build_optim_wrapper`` for an
        ``AmpOptimWrapper`` config: it builds ``ExtAmpOptimWrapper``, which
        runs mixed precision on CPU ranks too (MMEngine's refuses them)
        through the code GPU ranks run, or a float32 ``OptimWrapper`` on
        CPU ranks with ``mmddp_ext_cfg.cpu_amp=False``
        (:func:`~mmddp_ext.utils.precision.resolve_precision`). The log
        says which precision trains."""
        if isinstance(optim_wrapper, dict):
            precision = resolve_precision(optim_wrapper, get_device(),
                                          self.ext_cfg['cpu_amp'])
            if precision.reason:
                print_log(
                    f'ExtRunner: training in {precision.describe()}.',
                    logger='current')
            optim_wrapper = precision.optim_wrapper
        return super().build_optim_wrapper(optim_wrapper)

    def register_hooks(
            self,
            default_hooks: Optional[Dict[str, Union[Hook, Dict]]] = None,
            custom_hooks: Optional[List[Union[Hook, Dict]]] = None) -> None:
        """Differs from ``Runner.register_hooks``: adds the hooks of
        :func:`~mmddp_ext.runner.ext_cfg.ext_hooks` (``SafeCheckpointHook``,
        ``RankStatusHook`` and those ``mmddp_ext_cfg`` switches on), each
        unless the runner has one of its type already (listed in the
        config: that one keeps the config's arguments)."""
        super().register_hooks(default_hooks, custom_hooks)
        for hook_type, kwargs in ext_hooks(self.ext_cfg):
            cls = HOOKS.get(hook_type)
            if cls is None:
                raise ValueError(
                    f'mmddp_ext_cfg switches on {hook_type}, which is not '
                    'registered; is mmddp_ext up to date?')
            if not any(isinstance(h, cls) for h in self._hooks):
                self.register_hook(cls(**kwargs))

    def load_checkpoint(self, filename: str, *args, **kwargs):
        with safe_checkpoint_loading(self.cfg.get('trusted_checkpoints')):
            checkpoint = super().load_checkpoint(filename, *args, **kwargs)
        self._loaded_meta = checkpoint.get('meta')
        return checkpoint

    def load_or_resume(self) -> None:
        """Differs from ``Runner.load_or_resume`` when training starts: the
        start follows :func:`~mmddp_ext.runner.start_point.choose_start`
        (see the class docstring), rank 0 decides it for every rank, each
        rank logs it, and AutoDDP applies a stored decision before the
        first step. A latest checkpoint that is missing or cut short gives
        way to the newest whole training checkpoint of its directory, with
        a warning (none there: a ValueError that says what to do).
        Validation and testing load as stock."""
        if self._has_loaded or not self._training_starts:
            return super().load_or_resume()
        check_resume(self._resume)
        start, need = self._agree_on_start()
        log_on_every_rank(
            f'ExtRunner (rank {self.rank}/{self.world_size})'
            f'{_restart_text()}: {start.describe()}.',
            logging.WARNING if start.warn else logging.INFO)
        # What the runner loads, for hooks that read them (EMAHook swaps
        # its weights in after_load_checkpoint only for a resume).
        self._resume = start.action == 'resume'
        self._load_from = start.path
        if start.action == 'resume':
            seed_before = self.seed
            self.resume(start.path)
            if self.ext_cfg['exact_resume']:
                resume_data(self, self._loaded_meta, seed_before)
        elif start.action == 'load':
            self.load_checkpoint(start.path)
        self._has_loaded = True
        kept = self.message_hub.get_info(DECISION_INFO_KEY) or {}
        if need is not None and not kept.get('find_unused_parameters'):
            # Learnt after the checkpoint it resumed, or with none written.
            self.message_hub.update_info(DECISION_INFO_KEY, need)
        if isinstance(self.model, AutoDDP):
            self.model.apply_resumed_decision()

    def _agree_on_start(self) -> Tuple[StartPoint, Optional[dict]]:
        """Rank 0's start and AutoDDP need, on every rank (a failure on rank
        0 is raised on every rank)."""
        decided: List = [None]
        if self.rank == 0:
            try:
                decided = [self._decide_start()]
            except Exception as error:  # raised on every rank below
                decided = [f'{type(error).__name__}: {error}']
        broadcast_object_list(decided)
        if isinstance(decided[0], str):
            raise ValueError(
                f'ExtRunner (rank {self.rank}): rank 0 could not work out '
                f'where training starts: {decided[0]}')
        return decided[0]

    def _decide_start(self) -> Tuple[StartPoint, Optional[dict]]:
        """Apply the rule to the work dir; keep its record; find the
        AutoDDP need of the run this launch continues, if any."""
        work_dir = self.work_dir
        last = osp.join(work_dir, 'last_checkpoint')
        latest = None
        if osp.isfile(last):
            with open(last) as f:
                latest = f.read().strip() or None
        trusted = self.cfg.get('trusted_checkpoints')

        def peek(path: str) -> bool:
            return peek_is_training_checkpoint(path, trusted)

        def is_training_checkpoint(path: str) -> bool:
            damage = checkpoint_damage(path)
            if damage:
                other = newest_whole_checkpoint(osp.dirname(path), path, peek)
                raise ValueError(
                    f'the checkpoint to resume from, {path}, is {damage}. '
                    'Resume from another one (--resume PATH); the newest '
                    f'whole one of its directory is {other}.')
            return peek(path)

        def start_from(latest: Optional[str]):
            return choose_start(
                self._resume,
                self._load_from,
                checkpoint_stamp(latest),
                restart=restart_count(),
                record=read_record(work_dir, RECORD),
                is_training_checkpoint=is_training_checkpoint)

        start, record = start_from(latest)
        damage = checkpoint_damage(latest) if latest else None
        if damage and start.path == latest:
            # The latest checkpoint is damaged: its newest whole
            # predecessor stands in, and exact resume retrains from there.
            stand_in = newest_whole_checkpoint(
                osp.dirname(latest), latest, peek)
            if stand_in is None:
                raise ValueError(
                    f'{latest}, the latest checkpoint of {work_dir} '
                    f'(last_checkpoint), is {damage}, and no other whole '
                    'training checkpoint is there to resume from. To start '
                    f'again, delete {last}; to resume from a copy, pass '
                    '--resume PATH.')
            start, record = start_from(stand_in)
            start = replace(
                start,
                why=(f'{latest}, the latest checkpoint, is {damage}, so '
                     f'the newest whole one stands in for it; '
                     f'{start.why}'),
                warn=True)
            if record is not None:
                record['start'] = asdict(start)
        if record is not None:
            write_record(work_dir, RECORD, record)
            if not record['inputs']['resume']:  # a new run
                forget_need(work_dir)
                return start, None
        return start, read_need(work_dir)

    @property
    def _training_starts(self) -> bool:
        return getattr(self, '_in_train', False)

    def train(self) -> nn.Module:
        self._in_train = True
        try:
            model = super().train()
            announce_planned_exit()
            return model
        except Preempted:
            announce_planned_exit()
            raise
        except UnexpectedUnusedParameterError as error:
            # Every rank raised it; a torchrun restart resumes correctly.
            keep_need_for_restart(self, error)
            raise
        except RuntimeError as error:
            text = str(error).lower()
            if not (self.distributed and dist.is_initialized()
                    and any(word in text for word in _TIMEOUT_WORDS)):
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
        finally:
            self._stop_loader_workers()

    def _stop_loader_workers(self) -> None:
        """Stop the dataloader workers training leaves running (persistent
        workers, an iteration loop's pass), as training ends or fails:
        left to the garbage collector with the runner, each costs a 5 s
        stall in whatever the process runs next
        (:func:`~mmddp_ext.utils.torch_private.stop_loader_workers`). A
        later ``val``/``test`` starts its workers afresh."""
        for loop in (self._train_loop, self._val_loop):
            if loop is None or isinstance(loop, dict):
                continue
            stop_loader_workers(getattr(loop, 'dataloader', None))
            endless = getattr(loop, 'dataloader_iterator', None)
            if stop_loader_workers(getattr(endless, '_iterator', None)):
                endless._iterator = None

    def val(self) -> dict:
        metrics = super().val()
        announce_planned_exit()
        return metrics

    def test(self) -> dict:
        metrics = super().test()
        announce_planned_exit()
        return metrics


def _restart_text() -> str:
    restarts = restart_count()
    if not restarts:
        return ''
    parts = []
    torchrun = int(os.environ.get('TORCHELASTIC_RESTART_COUNT', 0) or 0)
    if torchrun:
        limit = os.environ.get('TORCHELASTIC_MAX_RESTARTS', '?')
        parts.append(f'restart {torchrun} of at most {limit} (torchrun '
                     'restarted every rank after one failed or was killed; '
                     'its exit is reported above)')
    requeues = int(os.environ.get('SLURM_RESTART_COUNT', 0) or 0)
    if requeues:
        parts.append(f'Slurm requeue {requeues} of job '
                     f"{os.environ.get('SLURM_JOB_ID')}")
    return ', ' + ', '.join(parts)
