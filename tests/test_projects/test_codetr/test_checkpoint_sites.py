"""The CO-DINO encoder's activation checkpointing goes through
torch.utils.checkpoint, so CheckpointConflictHook's policy reaches it."""
import torch

from mmddp_ext.utils import activation_checkpoint as act_cp
from ...test_models.dino_utils import raw_batch
from .codetr_utils import build_tiny, tiny_model_cfg

ENCODER = 'query_head.transformer.encoder'


def _model(with_cp):
    cfg = tiny_model_cfg()
    cfg.query_head.transformer.encoder.with_cp = with_cp
    return build_tiny(cfg)


def _train_step(model):
    data = model.data_preprocessor(raw_batch([1, 0]), training=True)
    model.parse_losses(model(**data, mode='loss'))[0].backward()


def test_encoder_checkpoints_under_the_policy_only_when_on(monkeypatch):
    seen = []
    act_cp.install()
    real_checkpoint = act_cp._originals['checkpoint']

    def spy(function, *args, **kwargs):
        seen.append(kwargs.get('use_reentrant'))
        return real_checkpoint(function, *args, **kwargs)

    monkeypatch.setitem(act_cp._originals, 'checkpoint', spy)
    try:
        for with_cp, policy, expected in ((1, 'non_reentrant', [False]),
                                          (1, None, [None]),
                                          (-1, 'non_reentrant', [])):
            seen.clear()
            model = _model(with_cp)
            act_cp.watch(model)
            act_cp.set_policy(policy)
            _train_step(model)
            assert seen == expected  # one checkpointed layer when on
            assert act_cp.stop_recording() == (
                {ENCODER: {None}} if expected else {})
            layer = model.query_head.transformer.encoder.layers[0]
            assert all(p.grad is not None and torch.isfinite(p.grad).all()
                       for p in layer.parameters())
        assert act_cp.config_key(model, ENCODER) is None  # with_cp=-1
        assert act_cp.config_key(_model(1), ENCODER) == \
            'model.query_head.transformer.encoder.with_cp'
    finally:
        act_cp.reset()
