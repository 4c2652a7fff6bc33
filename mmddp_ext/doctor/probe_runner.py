"""The config's own runner and train loop, with the probe in place of the
training steps.

:func:`build_probe_runner` builds the runner the config names
(``runner_type``: MMEngine's ``Runner``, ``ExtRunner`` or the user's own)
through a subclass that differs only where CPU ranks or the probe need it:

- ``wrap_model``: no DDP wrapper (the probe predicts what DDP does from
  its records instead of running it); the model stays on the CPU, and
  ``sync_bn`` converts it as a GPU launch would (its layers then run as
  the CPU twin, see :mod:`.cpu_twins`);
- ``build_optim_wrapper``: an ``AmpOptimWrapper`` runs as AMP on the CPU
  (``ExtAmpOptimWrapper``, the config's autocast dtype) from a loss scale
  of 1 (see :mod:`.cpu_twins`);
- ``build_train_loop``: the config's loop (epoch- or iteration-based, its
  dataloader built as configured) runs the probe's iterations instead of
  its own (:class:`ProbeLoopMixin`);
- ``load_or_resume``: nothing is loaded; the probe starts from the
  initialised weights (``Pretrained`` init entries are dropped before);
- ``_log_env``: the environment is not collected and logged.

Everything else is the runner's own: its hooks (default and custom, with
the ``mmddp_ext_cfg`` ones ``ExtRunner`` adds), the message hub with the
loop's epoch and iteration, the model's data preprocessor and the train
collate function. The probe does not validate, save checkpoints or run
the hooks of an epoch's end or the end of training (the config's
``default_hooks.checkpoint``, ``val_*`` and ``test_*`` are unset).
"""
import copy
import tempfile
from typing import Any, Callable

import torch.nn as nn

from ..utils.precision import resolve_precision

# Keys the probe unsets: it never validates, tests or saves.
UNSET_KEYS = ('val_dataloader', 'val_cfg', 'val_evaluator', 'test_dataloader',
              'test_cfg', 'test_evaluator', 'load_from')


def drop_pretrained(node: Any) -> Any:
    """``node`` without ``Pretrained`` init_cfg entries: the probe never
    downloads weights (random init is enough to see the graph)."""
    if isinstance(node, dict):
        if node.get('type') == 'Pretrained':
            return None
        return type(node)({k: drop_pretrained(v) for k, v in node.items()})
    if isinstance(node, list):
        return [drop_pretrained(v) for v in node]
    return node


def probe_config(cfg, work_dir: str):
    """A copy of ``cfg`` as the probe's runner builds it (see the module
    docstring)."""
    probe_cfg = copy.deepcopy(cfg)
    for key in UNSET_KEYS:
        probe_cfg[key] = None
    probe_cfg.model = drop_pretrained(probe_cfg.model)
    probe_cfg.resume = False
    probe_cfg.compile = False
    probe_cfg.work_dir = work_dir
    probe_cfg.launcher = 'pytorch'
    hooks = dict(probe_cfg.get('default_hooks') or {})
    hooks['checkpoint'] = None
    probe_cfg.default_hooks = hooks
    return probe_cfg


class ProbeLoopMixin:
    """Put before the config's train loop class: ``run`` calls the hooks
    that start training and the first epoch, then hands over to the probe
    (``runner.doctor_probe``), which runs its iterations through the
    loop's ``_iter`` and the iteration hooks."""

    def run(self) -> nn.Module:
        self.runner.call_hook('before_train')
        self.runner.call_hook('before_train_epoch')
        self.runner.model.train()
        self.runner.doctor_probe.run(self)
        return self.runner.model


class _ProbeRunnerMixin:
    """Put before the config's runner class (see the module docstring)."""

    doctor_probe = None
    doctor_precision = None

    def wrap_model(self, model_wrapper_cfg, model: nn.Module) -> nn.Module:
        from mmengine.model import convert_sync_batchnorm
        model = model.to('cpu')
        sync_bn = self.cfg.get('sync_bn', None)
        if sync_bn is not None:
            model = convert_sync_batchnorm(model, sync_bn)
        return model

    def build_optim_wrapper(self, optim_wrapper):
        if isinstance(optim_wrapper, dict):
            # What a GPU launch runs, whatever the runner type.
            self.doctor_precision = resolve_precision(optim_wrapper, 'cpu')
            optim_wrapper = self.doctor_precision.optim_wrapper
            if self.doctor_precision.amp:
                optim_wrapper = type(optim_wrapper)(
                    optim_wrapper, loss_scale=dict(init_scale=1.0))
        return super().build_optim_wrapper(optim_wrapper)

    def build_train_loop(self, loop):
        built = super().build_train_loop(loop)
        base = type(built)
        if not issubclass(base, ProbeLoopMixin):
            self.doctor_base_names['loop'] = base.__name__
            built.__class__ = type(f'DoctorProbe{base.__name__}',
                                   (ProbeLoopMixin, base), {})
        return built

    def load_or_resume(self) -> None:
        return None

    def _log_env(self, env_cfg) -> None:
        return None


def build_probe_runner(cfg, probe: Any, work_dir: str = None):
    """The config's runner class, probing (see the module docstring).
    ``probe.run(loop)`` runs the iterations."""
    from mmengine.registry import RUNNERS
    runner_type = cfg.get('runner_type') or 'Runner'
    base = (RUNNERS.get(runner_type)
            if isinstance(runner_type, str) else runner_type)
    if base is None:
        raise ValueError(f'runner_type {runner_type!r} is not registered.')
    cls: Callable = type(
        f'DoctorProbe{base.__name__}', (_ProbeRunnerMixin, base),
        dict(
            doctor_probe=probe,
            doctor_base_names=dict(runner=base.__name__, loop=None)))
    return cls.from_cfg(
        probe_config(cfg, work_dir or tempfile.mkdtemp(prefix='ddp_doctor_')))
