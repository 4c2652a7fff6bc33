"""What a launch of a config on N GPUs would use, read with the runner's
own resolver (:mod:`mmddp_ext.runner.ddp_setup`)."""
import datetime
from typing import Optional

from mmengine.registry import RUNNERS

from ..runner.ddp_setup import (EXT_CFG_DEFAULTS, DDPSetup, checked_ext_cfg,
                                resolve_ddp_setup)
from ..runner.ext_runner import ExtRunner
from ..utils.dist_env import DEFAULT_COLLECTIVE_TIMEOUT_S


def import_custom_modules(cfg) -> None:
    """Import the config's ``custom_imports`` (a config merged after
    loading, or one passed to a fresh process, has not done it)."""
    custom = cfg.get('custom_imports')
    if custom:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**custom)


def runner_class(cfg) -> Optional[type]:
    runner_type = cfg.get('runner_type') or 'Runner'
    cls = (RUNNERS.get(runner_type)
           if isinstance(runner_type, str) else runner_type)
    return cls if isinstance(cls, type) else None


def launch_setup(cfg, device: str = 'cuda') -> DDPSetup:
    """The DDP set-up of a launch of ``cfg`` on ``device``. An invalid
    ``mmddp_ext_cfg`` resolves with the defaults (the static config check
    reports it)."""
    cls = runner_class(cfg)
    ext_cfg = None
    if cls is not None and issubclass(cls, ExtRunner):
        try:
            ext_cfg = checked_ext_cfg(
                cfg.get('mmddp_ext_cfg'), EXT_CFG_DEFAULTS)
        except (TypeError, ValueError):
            ext_cfg = dict(EXT_CFG_DEFAULTS)
    return resolve_ddp_setup(cfg, ext_cfg, device)


def collective_timeout_s(cfg, setup: DDPSetup) -> float:
    """The collective timeout of a launch: ``env_cfg.dist_cfg.timeout``,
    else ExtRunner's bound, else torch's default."""
    given = ((cfg.get('env_cfg') or {}).get('dist_cfg') or {}).get('timeout')
    if given is not None:
        return float(given)
    if setup.opted_in:
        return float(DEFAULT_COLLECTIVE_TIMEOUT_S)
    from torch.distributed.constants import default_pg_timeout
    if isinstance(default_pg_timeout, datetime.timedelta):
        return default_pg_timeout.total_seconds()
    return float(default_pg_timeout)
