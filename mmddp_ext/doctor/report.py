"""The doctor's findings: one :class:`Check` per question, in a
:class:`DoctorReport` that serialises to JSON."""
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

OK, WARN, BLOCKER = 'ok', 'warn', 'blocker'
# The doctor itself failed: says nothing about the config either way.
DOCTOR_ERROR = 'doctor error'
VERDICTS = (OK, WARN, BLOCKER, DOCTOR_ERROR)
PHASES = ('dataset', 'config', 'environment', 'dynamic', 'gradients',
          'doctor')
EXIT_CODES = {OK: 0, WARN: 0, BLOCKER: 1, DOCTOR_ERROR: 2}


@dataclass
class Check:
    """One verdict.

    Args:
        phase (str): One of ``PHASES``.
        name (str): Short name of the question, e.g. 'unused parameters'.
        verdict (str): 'ok', 'warn', 'blocker' or 'doctor error' (the
            doctor failed; the config may be fine).
        summary (str): What was found, with its evidence.
        on_gpus (str): What it will do on N GPUs. Empty for ok.
        fix (list[str]): Config lines to paste, or commands to run.
        details (dict): Machine-readable facts (ranks, iteration, keys,
            ``traceback``).
    """
    phase: str
    name: str
    verdict: str
    summary: str
    on_gpus: str = ''
    fix: List[str] = field(default_factory=list)
    details: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f'Check verdict must be one of {VERDICTS}, '
                             f'but got {self.verdict!r}.')
        if self.phase not in PHASES:
            raise ValueError(f'Check phase must be one of {PHASES}, but '
                             f'got {self.phase!r}.')


@dataclass
class DoctorReport:
    """Everything one doctor run found, plus the raw dynamic records."""
    config: str
    nproc: int
    iters: int
    checks: List[Check] = field(default_factory=list)
    dynamic: Optional[Dict[str, Any]] = None
    gradient_equivalence: Optional[Dict[str, Any]] = None
    timings: Dict[str, float] = field(default_factory=dict)

    def add(self, checks: List[Check]) -> None:
        self.checks.extend(checks)

    @property
    def verdict(self) -> str:
        """The worst verdict: a blocker, else a doctor error, else a
        warn, else ok."""
        verdicts = {c.verdict for c in self.checks}
        for worst in (BLOCKER, DOCTOR_ERROR, WARN):
            if worst in verdicts:
                return worst
        return OK

    @property
    def exit_code(self) -> int:
        """1 when any check is a blocker; else 2 when the doctor itself
        failed (the verdict is unknown); else 0."""
        return EXIT_CODES[self.verdict]

    def find(self, phase: str, name: str) -> Check:
        """The check called ``name`` in ``phase`` (tests and CI use it)."""
        for check in self.checks:
            if check.phase == phase and check.name == name:
                return check
        raise KeyError(f'no check {phase}/{name}; have '
                       f'{[(c.phase, c.name) for c in self.checks]}')

    def to_dict(self) -> Dict[str, Any]:
        data = asdict(self)
        data['verdict'] = self.verdict
        return data

    def to_json(self, path: str) -> None:
        with open(path, 'w') as f:
            json.dump(self.to_dict(), f, indent=2, default=str)
