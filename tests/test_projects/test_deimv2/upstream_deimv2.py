"""Build official DEIMv2 models from an upstream checkout, in this process.

Used by ``data/make_upstream_manifests.py`` (the key/shape manifests the
conversion tests compare with), ``data/make_upstream_recipes.py`` and
``benchmarks/deimv2_vs_upstream.py``. Nothing here is needed by the port.

Upstream's package ``engine`` is imported without its training stack, by
:func:`mmddp_ext.testing.upstream_checkout.load_model_modules` (which says
what is stubbed), as ``test_dfine/upstream_dfine.py`` does for D-FINE: only
the modules a model and its criterion live in.
"""
import types

from mmddp_ext.testing.upstream_checkout import (build_from_yaml,
                                                 load_model_modules)

PACKAGES = ('engine', 'engine.core', 'engine.backbone', 'engine.deim',
            'engine.misc')
MODEL_MODULES = ('engine.backbone.hgnetv2', 'engine.backbone.dinov3_adapter',
                 'engine.deim.hybrid_encoder', 'engine.deim.lite_encoder',
                 'engine.deim.deim_decoder', 'engine.deim.deim_criterion',
                 'engine.deim.matcher', 'engine.deim.deim')

__all__ = ['build_from_yaml', 'load_upstream']


def load_upstream(root: str) -> types.SimpleNamespace:
    """Import DEIMv2's model modules from the checkout at ``root``.

    Returns:
        SimpleNamespace: ``workspace`` and ``yaml_utils`` (upstream's
        registry and YAML loader) and ``modules`` (name -> module of
        :data:`MODEL_MODULES`).
    """
    return load_model_modules(root, 'engine', PACKAGES, MODEL_MODULES,
                              'engine/deim',
                              'github.com/Intellindust-AI-Lab/DEIMv2')
