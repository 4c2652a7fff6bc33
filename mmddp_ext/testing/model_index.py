"""Parse configs without re-reading an external package's model index."""
import contextlib
import functools
from typing import Any, Iterator

from mmengine.config import utils as config_utils
from mmengine.fileio import load


@functools.lru_cache(maxsize=None)
def _load_once(path: str) -> Any:
    return load(path)


def _load(file, *args, **kwargs) -> Any:
    if args or kwargs or not isinstance(file, str):
        return load(file, *args, **kwargs)
    return _load_once(file)


@contextlib.contextmanager
def model_index_read_once() -> Iterator[None]:
    """Parse configs (``Config.fromfile``) in the block with each file of
    an external package's model index read once per process.

    Differs from MMEngine's own parsing only in how often the files are
    read: ``mmengine.config.utils._get_cfg_metainfo`` loads the package's
    ``.mim/model-index.yml`` and every ``metafile.yml`` it lists (about a
    hundred for mmdet) again for each ``mmdet::`` base a config names, a
    quarter of a second per config. Installed files do not change while a
    process runs, so the parsed configs are the same. The loaded dicts
    are shared: MMEngine only reads them.
    """
    read_each_time = config_utils.load
    config_utils.load = _load
    try:
        yield
    finally:
        config_utils.load = read_each_time
