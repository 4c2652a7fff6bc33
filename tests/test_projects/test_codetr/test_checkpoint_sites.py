"""The CO-DINO encoder's activation checkpointing is visible to
mmddp_ext's CheckpointConflictHook and becomes non-reentrant there."""
import torch
import torch.utils.checkpoint as torch_checkpoint

from mmddp_ext.utils import activation_checkpoint as act_cp
from ...test_models.dino_utils import raw_batch
from .codetr_utils import build_tiny, tiny_model_cfg

ENCODER = 'query_head.transformer.encoder'


def _model(with_cp):
    cfg = tiny_model_cfg()
    cfg.query_head.transformer.encoder.with_cp = with_cp
    return build_tiny(cfg)


def test_encoder_is_a_checkpoint_site_only_when_on():
    model = _model(with_cp=1)
    sites = act_cp.find_checkpoint_sites(model)
    assert [site.name for site in sites] == [ENCODER]
    assert sites[0].switchable and not sites[0].explicit_reentrant
    assert act_cp.config_key(model, ENCODER) == \
        'model.query_head.transformer.encoder.with_cp'
    assert act_cp.find_checkpoint_sites(_model(with_cp=-1)) == []


def test_marked_encoder_checkpoints_non_reentrant(monkeypatch):
    seen = []
    real_checkpoint = torch_checkpoint.checkpoint

    def spy(function, *args, **kwargs):
        seen.append(kwargs.get('use_reentrant'))
        kwargs.setdefault('use_reentrant', True)
        return real_checkpoint(function, *args, **kwargs)

    monkeypatch.setattr(torch_checkpoint, 'checkpoint', spy)
    marked, plain = _model(with_cp=1), _model(with_cp=1)
    act_cp.mark_non_reentrant(marked.query_head.transformer.encoder)
    for model, expected in ((marked, [False]), (plain, [None])):
        seen.clear()
        data = model.data_preprocessor(raw_batch([1, 0]), training=True)
        losses = model(**data, mode='loss')
        model.parse_losses(losses)[0].backward()
        # One checkpointed encoder layer; its parameters got gradients.
        assert seen == expected
        layer = model.query_head.transformer.encoder.layers[0]
        grads = [p.grad for p in layer.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
