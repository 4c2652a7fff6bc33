"""Small JSON records that a training run keeps in its work dir.

A restarted or resumed run must know things the run learnt before it had
written a checkpoint (where it started, what AutoDDP found). They live in
the work dir, next to MMEngine's ``last_checkpoint``, as small JSON files
that rank 0 writes whole (a reader never sees half a file).
"""
import json
import os
import os.path as osp
from typing import Any, Optional


def record_path(work_dir: str, name: str) -> str:
    return osp.join(work_dir, name)


def write_record(work_dir: str, name: str, content: Any) -> str:
    """Write ``content`` as JSON to ``work_dir/name`` atomically; returns
    the path."""
    path = record_path(work_dir, name)
    os.makedirs(work_dir, exist_ok=True)
    partial = f'{path}.{os.getpid()}.tmp'
    with open(partial, 'w') as f:
        json.dump(content, f, indent=1)
    os.replace(partial, path)
    return path


def read_record(work_dir: str, name: str) -> Optional[Any]:
    """The JSON content of ``work_dir/name``, or None if there is none (or
    it is not valid JSON: a record is a hint, never a reason to stop)."""
    path = record_path(work_dir, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def remove_record(work_dir: str, name: str) -> None:
    try:
        os.remove(record_path(work_dir, name))
    except FileNotFoundError:
        pass
