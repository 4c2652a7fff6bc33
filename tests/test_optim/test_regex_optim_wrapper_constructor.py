"""RegexOptimWrapperConstructor: upstream RT-DETR's ``get_optim_params``
rules on a small model (the zoo configs are checked against upstream's
own optimizer in tests/test_projects/test_rtdetr/test_rtdetr_param_groups
.py)."""
import pytest
import torch.nn as nn
from mmengine.optim import build_optim_wrapper
from mmengine.registry import FUNCTIONS

import mmddp_ext  # noqa: F401  (registers the constructor)


class Net(nn.Module):

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4))
        self.encoder = nn.MultiheadAttention(4, 2)
        self.head = nn.Linear(4, 2)
        self.backbone[0].bias.requires_grad = False  # a frozen parameter


def values(wrapper, model):
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {
        name_of[id(p)]: (g['lr'], g['weight_decay'], g['betas'])
        for g in wrapper.optimizer.param_groups
        for p in g['params']
    }


def build(model, paramwise_cfg):
    return build_optim_wrapper(
        model,
        dict(
            constructor='RegexOptimWrapperConstructor',
            optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.1),
            paramwise_cfg=paramwise_cfg))


def test_groups_follow_regexes_in_order_with_defaults_for_the_rest():
    model = Net()
    groups = [
        dict(params='^(?=.*backbone)(?!.*1\\.)', lr=1e-4),  # conv
        dict(params='^(?=.*backbone)(?=.*1\\.)', weight_decay=0.),  # BN
        dict(
            params='^(?!.*backbone).*bias', weight_decay=0., betas=(0.5, 0.6)),
    ]
    wrapper = build(model, dict(params=groups))
    got = values(wrapper, model)
    default = (0.9, 0.999)
    assert got == {
        'backbone.0.weight': (1e-4, 0.1, default),
        'backbone.1.weight': (1e-3, 0., default),
        'backbone.1.bias': (1e-3, 0., default),
        # re.search: 'bias' also matches in_proj_bias
        'encoder.in_proj_bias': (1e-3, 0., (0.5, 0.6)),
        'encoder.out_proj.bias': (1e-3, 0., (0.5, 0.6)),
        'head.bias': (1e-3, 0., (0.5, 0.6)),
        'encoder.in_proj_weight': (1e-3, 0.1, default),
        'encoder.out_proj.weight': (1e-3, 0.1, default),
        'head.weight': (1e-3, 0.1, default),
    }  # the frozen backbone.0.bias is left out, as upstream does
    sizes = [len(g['params']) for g in wrapper.optimizer.param_groups]
    assert sizes == [1, 2, 3, 3]


def test_wrapped_model_and_name_map():
    """DDP-style ``.module`` is unwrapped; ``param_name_map`` renames
    before matching (a registered function, with its kwargs)."""

    @FUNCTIONS.register_module(force=True)
    def _upper_case_names(model, suffix):
        return {n: n.upper() + suffix for n, _ in model.named_parameters()}

    model = Net()
    wrapped = nn.Module()
    wrapped.module = model
    wrapper = build(
        wrapped,
        dict(
            params=[dict(params='^HEAD.*!$', lr=5.)],
            param_name_map=dict(type='_upper_case_names', suffix='!')))
    got = values(wrapper, model)
    assert got['head.weight'][0] == got['head.bias'][0] == 5.
    assert got['encoder.in_proj_bias'][0] == 1e-3


def test_without_params_one_group_of_everything():
    model = Net()
    wrapper = build(model, dict(params=[]))
    assert len(wrapper.optimizer.param_groups) == 1
    assert len(wrapper.optimizer.param_groups[0]['params']) == 9


@pytest.mark.parametrize('paramwise_cfg,error,match', [
    (dict(params=[dict(
        params='bias'), dict(params='head')]), ValueError,
     r"'head.bias'.*params\[0\] \('bias'\) and params\[1\] \('head'\)"),
    (dict(params=[dict(params='(')]), ValueError,
     'not a valid regular expression'),
    (dict(params=[dict(lr=1.)]), TypeError, 'must be a dict whose'),
    (dict(params='backbone'), TypeError, 'must be a list of dicts'),
    (dict(params=[], custom_keys={}), ValueError,
     "'custom_keys'.*DefaultOptimWrapperConstructor"),
    (dict(param_name_map=dict(type='no_such_function')), ValueError,
     "'no_such_function' is not in"),
    (dict(param_name_map=lambda model: {}), ValueError,
     'gave no upstream name for 9 trainable'),
])
def test_config_errors_name_the_key(paramwise_cfg, error, match):
    with pytest.raises(error, match=match):
        build(Net(), paramwise_cfg)
