"""CO-DINO R50 and Swin-L parameter names and shapes match upstream's
(the pinned lists: regen_keys.py writes them from upstream's own code and
config files, and each file's header names its source)."""
import os.path as osp

import pytest

from ...helpers import REPO_ROOT
from .codetr_utils import import_project
from .regen_keys import CODINO_CONFIGS, PINS, build_entries, read_pin

# The port's config of each pin's upstream config.
PORT_CONFIG = {
    'r50': osp.join(REPO_ROOT, 'configs', 'co_dino_ext.py'),
    'swin_l': osp.join(CODINO_CONFIGS,
                       'co_dino_5scale_swin_l_16xb1_1x_coco.py'),
}

# Every config of a backbone builds the same state dict: upstream's
# checkpoints of all of them load strictly.
SAME_KEYS = {
    'r50': ['co_dino_5scale_r50_lsj_8xb2_1x_coco.py'],
    'swin_l': [
        'co_dino_5scale_swin_l_lsj_16xb1_1x_coco.py',
        'co_dino_5scale_swin_l_16xb1_16e_o365tococo.py',
    ],
}
NUM_KEYS = {'r50': 674}


@pytest.mark.parametrize('name', sorted(PINS))
def test_state_dict_matches_upstream_keys_and_shapes(name):
    import_project()
    config, pinned = PORT_CONFIG[name], read_pin(PINS[name][1])
    if name in NUM_KEYS:
        assert len(pinned) == NUM_KEYS[name]
    for path in [config] + [
            osp.join(CODINO_CONFIGS, other) for other in SAME_KEYS[name]
    ]:
        built = build_entries(path)
        missing = sorted(set(pinned) - set(built))
        unexpected = sorted(set(built) - set(pinned))
        assert missing == [] and unexpected == [], (path, missing[:10],
                                                    unexpected[:10])
        assert [k for k, _ in built] == [k for k, _ in pinned]  # same order


def test_swin_l_pin_differs_from_r50_only_in_backbone_and_neck_inputs():
    """The two pins were written apart; their CO-DINO parts must agree."""
    r50, swin = (dict(read_pin(PINS[name][1])) for name in ('r50', 'swin_l'))
    head = {k for k in r50 if not k.startswith(('backbone.', 'neck.'))}
    assert head == {
        k
        for k in swin if not k.startswith(('backbone.', 'neck.'))
    }
    assert all(r50[k] == swin[k] for k in head)
    assert swin['neck.convs.3.conv.weight'] == (256, 1536, 1, 1)
    assert any(k.startswith('backbone.stages.2.blocks.17.') for k in swin)


def test_original_codetr_label_embedding_key_loads():
    """Sense-X/Co-DETR checkpoints name the dn label embedding
    ``query_head.label_embedding``; it lands in the dn generator."""
    import torch

    from .codetr_utils import build_tiny, tiny_model_cfg
    model = build_tiny(tiny_model_cfg())
    state = model.state_dict()
    weight = torch.randn_like(state['query_head.dn_generator.'
                                    'label_embedding.weight'])
    state.pop('query_head.dn_generator.label_embedding.weight')
    state['query_head.label_embedding.weight'] = weight
    model.load_state_dict(state, strict=True)
    torch.testing.assert_close(
        model.query_head.dn_generator.label_embedding.weight,
        weight,
        rtol=0,
        atol=0)
