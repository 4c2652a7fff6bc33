"""The ready-to-run config files the config tests cover, found by glob so
that configs added later are covered without editing a list."""
import glob
import os.path as osp
from typing import Any, Iterator, List, Tuple

from ..helpers import REPO_ROOT

PATTERNS = ('configs/**/*.py', 'projects/*/configs/**/*.py')


def config_files() -> List[str]:
    """Every config under configs/ and projects/*/configs/ that is not in a
    ``_base_`` folder, relative to the repository root."""
    found = set()
    for pattern in PATTERNS:
        for path in glob.glob(osp.join(REPO_ROOT, pattern), recursive=True):
            relative = osp.relpath(path, REPO_ROOT)
            if '_base_' not in relative.split(osp.sep):
                found.add(relative)
    return sorted(found)


def custom_config_files() -> List[str]:
    """The custom-data configs (file name contains 'custom')."""
    return [p for p in config_files() if 'custom' in osp.basename(p)]


def leaf_datasets(dataset: Any, key: str) -> Iterator[Tuple[str, dict]]:
    """``(key, config)`` of each dataset inside dataset wrappers."""
    if not isinstance(dataset, dict):
        return
    if isinstance(dataset.get('datasets'), list):
        for index, child in enumerate(dataset['datasets']):
            yield from leaf_datasets(child, f'{key}.datasets.{index}')
    elif isinstance(dataset.get('dataset'), dict):
        yield from leaf_datasets(dataset['dataset'], f'{key}.dataset')
    else:
        yield key, dataset
