"""What a launch of a config on N GPUs would use, read with the runner's
own resolver (:mod:`mmddp_ext.runner.ddp_setup`)."""
import datetime

from ..launch.process_group import DEFAULT_COLLECTIVE_TIMEOUT_S
from ..runner.ddp_setup import DDPSetup, resolve_ddp_setup


def import_custom_modules(cfg) -> None:
    """Import the config's ``custom_imports`` (a config merged after
    loading, or one passed to a fresh process, has not done it)."""
    custom = cfg.get('custom_imports')
    if custom:
        from mmengine.utils import import_modules_from_strings
        import_modules_from_strings(**custom)


def launch_setup(cfg, device: str = 'cuda') -> DDPSetup:
    """The DDP set-up of a launch of ``cfg`` on ``device``, as the runner
    resolves it. An invalid ``mmddp_ext_cfg`` resolves with the defaults
    (the static config check reports it)."""
    return resolve_ddp_setup(cfg, device=device)


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
