"""What the report keeps of an exception raised in the probe."""
import os
import os.path as osp
import traceback
from typing import Any, Dict

TRACEBACK_CHARS = 4000
DOCTOR_DIR = osp.dirname(osp.abspath(__file__))


def describe_error(error: BaseException, phase: str,
                   after_divergence: bool = False) -> Dict[str, Any]:
    """What the report needs of an exception: type, message, traceback,
    the phase, and whether the doctor's own code raised it (the innermost
    frame is in ``mmddp_ext/doctor``) or the ranks had already diverged
    (the rest of the iteration ran with single-process semantics)."""
    frames = traceback.extract_tb(error.__traceback__)
    raised_in = frames[-1].filename if frames else ''
    return dict(
        type=type(error).__name__,
        message=str(error)[:800],
        phase=phase,
        doctor=osp.abspath(raised_in).startswith(DOCTOR_DIR + os.sep),
        after_divergence=after_divergence,
        traceback=''.join(
            traceback.format_exception(
                type(error), error,
                error.__traceback__))[-TRACEBACK_CHARS:])
