"""The doctor's view of activation checkpointing, through what
mmddp_ext.utils.activation_checkpoint has (watch, set_policy,
config_key)."""
import torch
from mmdet.models.backbones import ResNet

from mmddp_ext.doctor import checkpoint_sites
from mmddp_ext.utils import activation_checkpoint as act_cp


def _resnet(with_cp: bool) -> ResNet:
    model = ResNet(depth=18, with_cp=with_cp, out_indices=(3, ))
    model.train()  # mmdet's ResNet.train returns None
    return model


def test_static_sites_and_their_config_keys():
    model = _resnet(True)
    names = checkpoint_sites.switched_on(model)
    assert names[:2] == ['layer1.0', 'layer1.1'] and len(names) == 8
    assert checkpoint_sites.config_keys(model, names) == ['model.with_cp']
    listed = checkpoint_sites.switched_on(_resnet(False), ['layer2'])
    assert listed == ['layer2']  # MMEngine's activation_checkpointing
    assert checkpoint_sites.switched_on(_resnet(False)) == []


def test_observed_sites_and_the_policy():
    model = _resnet(True)
    x = torch.randn(1, 3, 32, 32, requires_grad=True)
    try:
        with checkpoint_sites.observed(model) as sites:
            model(x)[0].sum().backward()
        assert sorted(sites) == sorted(checkpoint_sites.switched_on(model))
        assert checkpoint_sites.apply_policy(model, None) == []
        assert act_cp.current_policy() is None
        changed = checkpoint_sites.apply_policy(model, 'non_reentrant')
        assert len(changed) == 8
        assert act_cp.current_policy() == 'non_reentrant'
        with checkpoint_sites.observed(_resnet(False)) as none:
            _resnet(False)(x)
        assert none == []
    finally:
        act_cp.reset()
