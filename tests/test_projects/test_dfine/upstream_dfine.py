"""Build official D-FINE models from an upstream checkout, in this process.

Used by ``data/make_upstream_manifests.py`` (the key/shape manifests the
conversion tests compare with) and ``benchmarks/dfine_vs_upstream.py``
(numerical equivalence and speed). Nothing here is needed by the port.

Upstream's package ``src`` is imported without its training stack, by
:func:`mmddp_ext.testing.upstream_checkout.load_model_modules` (which says
what is stubbed): only the modules a model, its criterion and its matcher
live in.
"""
import types

from mmddp_ext.testing.upstream_checkout import (build_from_yaml,
                                                 load_model_modules)

PACKAGES = ('src', 'src.core', 'src.nn', 'src.nn.backbone', 'src.zoo',
            'src.misc')
ZOO = ('denoising', 'dfine_utils', 'dfine_decoder', 'hybrid_encoder',
       'matcher', 'dfine_criterion', 'dfine')
HGNETV2 = 'src.nn.backbone.hgnetv2'

__all__ = ['build_from_yaml', 'load_upstream']


def load_upstream(root: str) -> types.SimpleNamespace:
    """Import D-FINE's model modules from the checkout at ``root``.

    Returns:
        SimpleNamespace: ``workspace`` and ``yaml_utils`` (upstream's
        registry and YAML loader), ``zoo`` (``src.zoo.dfine``'s modules
        ``dfine``, ``dfine_decoder``, ``hybrid_encoder``,
        ``dfine_criterion``, ``matcher``, ``denoising``, ``dfine_utils``)
        and ``hgnetv2``.
    """
    upstream = load_model_modules(root, 'src', PACKAGES, [HGNETV2] +
                                  [f'src.zoo.dfine.{name}'
                                   for name in ZOO], 'src/zoo/dfine',
                                  'github.com/Peterande/D-FINE')
    zoo = types.SimpleNamespace(
        **{name: upstream.modules[f'src.zoo.dfine.{name}']
           for name in ZOO})
    return types.SimpleNamespace(
        workspace=upstream.workspace,
        yaml_utils=upstream.yaml_utils,
        zoo=zoo,
        hgnetv2=upstream.modules[HGNETV2])
