"""DDP doctor: predict, on CPU, whether a config trains on N GPUs.

``python tools/ddp_doctor.py CONFIG`` runs static checks (dataset, config,
environment), a dynamic probe on N gloo ranks through the config's own
runner with an adversarial batch schedule, and a gradient-equivalence
comparison, and reports a verdict per check. Importing this package
registers nothing. docs/doctor.md describes it, with its limits.
"""
from ..runner.ddp_setup import DDPSetup
from .doctor import run_doctor
from .launch_setup import launch_setup
from .render import log_report, render
from .report import BLOCKER, DOCTOR_ERROR, OK, WARN, Check, DoctorReport
from .shrink import shrink_config

__all__ = [
    'BLOCKER', 'DOCTOR_ERROR', 'OK', 'WARN', 'Check', 'DDPSetup',
    'DoctorReport', 'launch_setup', 'log_report', 'render', 'run_doctor',
    'shrink_config'
]
