"""mmddp_ext: DDP that just works for DETR-family detectors in MMDet 3.x.

Importing the package registers every component (runner, hooks, model
wrappers, collate functions, models) in the MMEngine/MMDetection
registries. Version ranges live in the package metadata; an untested
version only produces a warning here.
"""
import warnings

from .version import __version__  # noqa: F401


def _warn_on_untested_versions() -> None:
    from importlib import metadata
    tested = {'mmengine': '0.10.', 'mmdet': '3.3.', 'mmcv': '2.1.'}
    for name, prefix in tested.items():
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        if not version.startswith(prefix):
            warnings.warn(
                f'mmddp_ext is tested with {name} {prefix}x; found '
                f'{version}. It may still work; please report problems.')


_warn_on_untested_versions()

from . import (datasets, hooks, models, optim, runner, utils,  # noqa: E402
               wrappers)
from .datasets import *  # noqa: F401,F403,E402
from .hooks import *  # noqa: F401,F403,E402
from .models import *  # noqa: F401,F403,E402
from .optim import *  # noqa: F401,F403,E402
from .runner import *  # noqa: F401,F403,E402
from .utils import *  # noqa: F401,F403,E402
from .wrappers import *  # noqa: F401,F403,E402

__all__ = ['__version__'] + [
    name
    for package in (datasets, hooks, models, optim, runner, utils, wrappers)
    for name in package.__all__
]
