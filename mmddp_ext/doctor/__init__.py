"""DDP doctor: predict, on CPU, whether a config trains on N GPUs.

``python tools/ddp_doctor.py CONFIG`` runs static checks (dataset, config,
environment), a dynamic probe on N gloo ranks with an adversarial batch
schedule, and a gradient-equivalence comparison, and reports a verdict per
check. Importing this package registers nothing.
"""
from .ddp_setup import DDPSetup, resolve_setup
from .doctor import run_doctor
from .render import log_report, render
from .report import BLOCKER, OK, WARN, Check, DoctorReport
from .shrink import shrink_config

__all__ = [
    'BLOCKER', 'OK', 'WARN', 'Check', 'DDPSetup', 'DoctorReport',
    'log_report', 'render', 'resolve_setup', 'run_doctor', 'shrink_config'
]
