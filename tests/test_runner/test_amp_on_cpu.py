"""An AMP recipe (``optim_wrapper.type='AmpOptimWrapper'``, as RT-DETRv2,
D-FINE and DEIM configs set it, as upstream) on CPU ranks: ExtRunner trains
it in float32 with a warning; stock MMEngine refuses to build it."""
import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel

AMP = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    dtype='float16',
    optimizer=dict(type='SGD', lr=0.1))


class LinearModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(inputs).pow(2).mean()
        return dict(loss=out) if mode == 'loss' else out


def _runner(runner_type, work_dir):
    from mmddp_ext.runner.ext_runner import ExtRunner
    from mmengine.runner import Runner
    cls = dict(ExtRunner=ExtRunner, Runner=Runner)[runner_type]
    return cls(
        model=LinearModel(),
        work_dir=str(work_dir),
        cfg=dict(optim_wrapper=AMP))


def test_ext_runner_trains_an_amp_recipe_in_float32_on_cpu(tmp_path):
    from mmengine.logging import MMLogger
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    runner = _runner('ExtRunner', tmp_path)
    wrapper = runner.build_optim_wrapper(AMP)
    assert type(wrapper) is OptimWrapper
    assert not isinstance(wrapper, AmpOptimWrapper)
    before = runner.model.linear.weight.detach().clone()
    wrapper.update_params(
        runner.model(torch.ones(2, 3), mode='loss')['loss'])
    assert not torch.equal(before, runner.model.linear.weight)
    log = open(MMLogger.get_current_instance().log_file).read()
    assert 'ExtRunner: AmpOptimWrapper skipped' in log


def test_stock_runner_refuses_the_same_recipe_on_cpu(tmp_path):
    """The negative control: what users of an AMP config see on CPU."""
    runner = _runner('Runner', tmp_path)
    with pytest.raises(AssertionError, match='only available training on'):
        runner.build_optim_wrapper(AMP)
