"""Checkpoints that load with ``torch.load(weights_only=True)``.

Since torch 2.6 ``torch.load`` refuses arbitrary pickled globals, and
MMEngine's checkpoints contain several: ``HistoryBuffer`` objects in the
message hub, numpy arrays and scalars, and, through ``HistoryBuffer``'s
statistics table, functions pickled as ``builtins.getattr`` calls.
Allow-listing ``getattr`` would let a file reach any attribute of any
allowed object, which defeats ``weights_only``. So mmddp_ext fixes what
gets written (:func:`to_plain`, only tensors and plain Python containers)
and reads with ``weights_only=True`` (:func:`load_checkpoint_file`). A file
that still contains another global is refused unless the user names it as
trusted.
"""
import contextlib
import os
import os.path as osp
import pickle
import re
from collections import Counter, OrderedDict
from typing import Any, Callable, Iterable, Iterator, Optional, Union

import numpy as np
import torch
from mmengine.logging import HistoryBuffer, print_log
from mmengine.runner.checkpoint import CheckpointLoader

HISTORY_BUFFER_TAG = '__mmddp_ext_history_buffer__'
TRUSTED_ENV = 'MMDDP_EXT_TRUSTED_CHECKPOINTS'
_PLAIN_SCALARS = (str, int, float, bool, bytes, type(None), torch.dtype,
                  torch.device, torch.Size)

# Harmless types accepted on top of torch's own weights-only allow-list:
# plain containers whose reconstruction runs no user code.
HARMLESS_GLOBALS = [Counter, OrderedDict]


class UnsafeCheckpointError(ValueError):
    """A checkpoint contains pickled globals beyond the safe allow-list."""


def history_buffer_to_plain(buffer: HistoryBuffer) -> dict:
    """Encode a ``HistoryBuffer`` as tensors and ints."""
    logs, counts = buffer.data
    return {
        HISTORY_BUFFER_TAG: True,
        # from_numpy: on the host, whatever torch's default device is
        'log_history': torch.from_numpy(np.asarray(logs, dtype=np.float64)),
        'count_history': torch.from_numpy(
            np.asarray(counts, dtype=np.float64)),
        'max_length': int(buffer.max_length),
    }


def plain_to_history_buffer(state: dict) -> HistoryBuffer:
    """Inverse of :func:`history_buffer_to_plain`."""
    return HistoryBuffer(
        state['log_history'].tolist(),
        state['count_history'].tolist(),
        max_length=state['max_length'])


def to_plain(obj: Any,
             path: str = 'checkpoint',
             on_drop: Optional[Callable[[str, Any], None]] = None) -> Any:
    """Recursively convert ``obj`` into what ``weights_only`` accepts.

    Tensors and plain containers are kept; ``HistoryBuffer`` becomes a
    tagged dict; numpy arrays become tensors and numpy scalars Python
    scalars. Anything else is dropped and reported through ``on_drop``.

    Args:
        obj: The object to convert.
        path (str): Where ``obj`` sits, for messages. Defaults to
            'checkpoint'.
        on_drop (callable, optional): Called with ``(path, obj)`` for every
            value that had to be dropped. Defaults to None.
    """
    # np.float64 subclasses float, so numpy is handled before plain types.
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, (torch.Tensor, ) + _PLAIN_SCALARS):
        return obj
    if isinstance(obj, HistoryBuffer):
        return history_buffer_to_plain(obj)
    if isinstance(obj, dict):
        converted = type(obj)() if isinstance(obj,
                                              (OrderedDict, Counter)) else {}
        for key, value in obj.items():
            plain = to_plain(value, f'{path}.{key}', on_drop)
            if plain is not _DROPPED:
                converted[key] = plain
        return converted
    if isinstance(obj, (list, tuple, set)):
        items = [to_plain(v, f'{path}[{i}]', on_drop) for i, v in
                 enumerate(obj)]
        return type(obj)(v for v in items if v is not _DROPPED)
    if on_drop is not None:
        on_drop(path, obj)
    return _DROPPED


class _Dropped:

    def __repr__(self) -> str:
        return '<dropped>'


_DROPPED = _Dropped()


def restore_history_buffers(obj: Any) -> Any:
    """Turn the tagged dicts written by :func:`to_plain` back into
    ``HistoryBuffer`` objects, in place where possible."""
    if isinstance(obj, dict):
        if obj.get(HISTORY_BUFFER_TAG) is True:
            return plain_to_history_buffer(obj)
        for key, value in obj.items():
            obj[key] = restore_history_buffers(value)
    elif isinstance(obj, list):
        obj[:] = [restore_history_buffers(v) for v in obj]
    return obj


def trusted_paths(extra: Union[None, str, Iterable[str]] = None) -> set:
    """Absolute paths the user explicitly trusts for unsafe loading.

    Args:
        extra (str | Iterable[str], optional): From the config key
            ``trusted_checkpoints`` or ``--trust-checkpoint``.
            Defaults to None.
    """
    names = [p for p in os.environ.get(TRUSTED_ENV, '').split(os.pathsep)
             if p]
    if isinstance(extra, str):
        names.append(extra)
    elif extra is not None:
        names.extend(extra)
    return {osp.realpath(osp.expanduser(n)) for n in names}


def _offending_global(error: Exception) -> str:
    match = re.search(r'GLOBAL ([\w.]+)', str(error))
    if match:
        return match.group(1)
    match = re.search(r'Unsupported global:?\s*([\w.]+)', str(error))
    return match.group(1) if match else 'an unsupported object'


def load_checkpoint_file(filename: str,
                         map_location: Any = None,
                         trusted: Union[None, str, Iterable[str]] = None):
    """Load a local checkpoint with ``weights_only=True``.

    Args:
        filename (str): Local path.
        map_location: Same as ``torch.load``. Defaults to None.
        trusted (str | Iterable[str], optional): Paths allowed to load with
            ``weights_only=False`` when the safe load refuses them.
            Defaults to None.

    Raises:
        UnsafeCheckpointError: The file needs a global outside the
            allow-list and is not trusted. The message names the global and
            the opt-in.
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename} can not be found.')
    try:
        with torch.serialization.safe_globals(HARMLESS_GLOBALS):
            return torch.load(
                filename, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if osp.realpath(filename) not in trusted_paths(trusted):
            bad = _offending_global(error)
            raise UnsafeCheckpointError(
                f'Refusing to load {filename}: it pickles {bad}, which '
                "torch.load(weights_only=True) will not run (it could "
                'execute code). Checkpoints written by mmddp_ext never need '
                'it; this file comes from stock MMEngine or elsewhere. If '
                'you trust the file, opt in explicitly for this path: '
                f"trusted_checkpoints=['{filename}'] in the config, "
                f'`--trust-checkpoint {filename}` for tools/train.py, or '
                f'{TRUSTED_ENV}={filename} in the environment.') from error
    print_log(
        f'mmddp_ext: loading trusted checkpoint {filename} with '
        'weights_only=False (explicit opt-in)',
        logger='current',
        level=30)
    return torch.load(filename, map_location=map_location, weights_only=False)


@contextlib.contextmanager
def safe_checkpoint_loading(
        trusted: Union[None, str, Iterable[str]] = None) -> Iterator[None]:
    """Route MMEngine's local-file checkpoint loading through
    :func:`load_checkpoint_file` while the context is open."""
    original = CheckpointLoader._get_checkpoint_loader('')

    def load_from_local_weights_only(filename, map_location):
        return load_checkpoint_file(filename, map_location, trusted)

    CheckpointLoader.register_scheme(
        prefixes='', loader=load_from_local_weights_only, force=True)
    try:
        yield
    finally:
        CheckpointLoader.register_scheme(
            prefixes='', loader=original, force=True)
