"""DEIM's weights back to upstream's layout: DEIM has no key table of its
own (its D-FINE-based models go through D-FINE's, its RT-DETRv2-based
ones through RT-DETR's v2 table), so upstream -> port -> upstream through
those, for the DEIM configs, is the identity on every tensor."""
import os.path as osp

import pytest
from mmengine.config import Config

from mmddp_ext.utils import build_reference_model, compare_state_dicts
from ..test_dfine.test_convert_dfine_checkpoint import synthetic_checkpoint
from ..test_rtdetr.upstream_layout import (_mlp, rtdetr_layout,
                                           synthetic_state_dict,
                                           with_upstream_anchors)
from . import upstream_recipes as upstream
from .deim_utils import REPO_ROOT, import_dfine, import_rtdetr

CONFIGS = osp.join(REPO_ROOT, 'projects', 'DEIM', 'configs')
BUFFERS = ('running_mean', 'running_var', 'num_batches_tracked', 'anchors',
           'valid_mask', 'num_points_scale')
quiet = lambda line: None  # noqa: E731


def deim_r18vd_layout() -> dict:
    """Upstream DEIM-RTDETRv2-R18's state dict layout: RT-DETRv2-R18's
    with the 'as_reg' query position head, MLP(4, 256, 256, 3)."""
    layout = {
        k: v
        for k, v in rtdetr_layout(2, 18, num_layers=3, expansion=0.5).items()
        if not k.startswith('decoder.query_pos_head.')
    }
    layout.update(_mlp('decoder.query_pos_head', [4, 256, 256, 256]))
    return layout


def test_the_r18vd_layout_has_upstreams_parameters():
    """Its parameters are, name for name and shape for shape, those
    upstream DEIM's own model has (pinned in data/upstream_recipes.json)."""
    key = upstream.recipe(
        upstream.DEIM,
        'configs/deim_rtdetrv2/deim_r18vd_120e_coco.yml')['param_names']
    pinned = dict(
        zip(upstream.load()['parameters'][key],
            upstream.load()['parameter_shapes'][key]))
    layout = {
        k: v
        for k, v in deim_r18vd_layout().items() if not k.endswith(BUFFERS)
    }
    assert layout == pinned


@pytest.mark.parametrize('backbone', ['hgnetv2_n', 'rtdetrv2_r18vd'])
def test_round_trip_through_the_port_is_the_identity(backbone, monkeypatch):
    cfg = Config.fromfile(osp.join(CONFIGS, f'deim_{backbone}_coco.py'))
    model = build_reference_model(cfg, device='meta')
    if backbone == 'hgnetv2_n':
        # DEIM-D-FINE-N has D-FINE-N's keys and shapes
        dfine = import_dfine()
        state = with_upstream_anchors(
            synthetic_checkpoint('n'), (640, 640), strides=(16, 32))
        port = dfine.convert_dfine_state_dict(state, model.state_dict(),
                                              dfine.decoder_num_points(model),
                                              quiet)
        back = dfine.convert_dfine_to_upstream(port, model, (640, 640), quiet)
    else:
        # the command line reads v2 from the config's param_name_map
        monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
        import convert_rtdetr_checkpoint
        assert convert_rtdetr_checkpoint.upstream_version(cfg, None) == 2
        rtdetr = import_rtdetr()
        state = with_upstream_anchors(
            synthetic_state_dict(deim_r18vd_layout()), (640, 640),
            strides=(8, 16, 32))
        port = rtdetr.convert_rtdetr_state_dict(
            state, model.state_dict(), log=quiet)
        back = rtdetr.convert_rtdetr_to_upstream(port, model, 2, (640, 640),
                                                 quiet)
    assert compare_state_dicts(state, back) == []
