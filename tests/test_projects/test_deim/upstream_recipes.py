"""Read ``data/upstream_recipes.json``: what upstream D-FINE's and DEIM's
own code make of their official configs (written by
``data/make_upstream_recipes.py``; repositories and commits in its
``source``)."""
import functools
import json
import os.path as osp
from typing import Dict, List

DATA = osp.join(
    osp.dirname(osp.abspath(__file__)), 'data', 'upstream_recipes.json')
DFINE = 'D-FINE'
DEIM = 'DEIM'


@functools.lru_cache(maxsize=1)
def load() -> dict:
    with open(DATA) as f:
        return json.load(f)


def recipe(repository: str, yml: str) -> dict:
    """The record of one upstream config (``yml`` relative to the
    checkout, e.g. ``configs/dfine/dfine_hgnetv2_n_coco.yml``)."""
    return load()['configs'][f'{repository}/{yml}']


def configs(repository: str) -> Dict[str, dict]:
    """Every recorded config of ``repository`` by its YAML path."""
    prefix = f'{repository}/'
    return {
        key[len(prefix):]: value
        for key, value in load()['configs'].items() if key.startswith(prefix)
    }


def repository(name: str) -> dict:
    """The per-repository records (``ema_traces``, DEIM's
    ``mixup_example`` and ``mosaic_example``)."""
    return load()['repositories'][name]


def param_groups(record: dict) -> List[dict]:
    """The record's optimizer groups with parameter names (upstream's)."""
    names = load()['parameters'][record['param_names']]
    return [
        dict(group, params=[names[i] for i in group['params']])
        for group in record['param_groups']
    ]
