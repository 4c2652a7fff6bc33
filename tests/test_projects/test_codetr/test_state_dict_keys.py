"""CO-DINO R50 5-scale parameter names and shapes match upstream's."""
from .codetr_utils import EXT_CONFIG, KEYS_FILE, import_project


def _pinned():
    """(key, shape) per line of the pinned list; '#' lines are comments."""
    entries = []
    with open(KEYS_FILE) as f:
        for line in f:
            line = line.rstrip('\n')
            if not line or line.startswith('#'):
                continue
            key, shape = line.rsplit(' ', 1)
            dims = tuple(int(d) for d in shape.split(',')) if shape else ()
            entries.append((key, dims))
    return entries


def test_r50_5scale_state_dict_matches_upstream_keys_and_shapes():
    import torch
    from mmdet.registry import MODELS
    from mmengine.config import Config
    import_project()
    cfg = Config.fromfile(EXT_CONFIG).model
    cfg.backbone.init_cfg = None  # no download
    with torch.device('meta'):
        model = MODELS.build(cfg)
    built = [(k, tuple(v.shape)) for k, v in model.state_dict().items()]
    pinned = _pinned()
    assert len(pinned) == 674
    missing = sorted(set(pinned) - set(built))
    unexpected = sorted(set(built) - set(pinned))
    assert missing == [] and unexpected == [], (missing[:10], unexpected[:10])
    assert [k for k, _ in built] == [k for k, _ in pinned]  # same order


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
