"""An AMP recipe (``optim_wrapper.type='AmpOptimWrapper'``, as RT-DETRv2,
D-FINE and DEIM configs set it, as upstream) under ExtRunner: mixed
precision on the training device, CPU ranks included (ExtAmpOptimWrapper),
float32 on CPU ranks with ``mmddp_ext_cfg.cpu_amp=False``; the log says
which. Stock MMEngine refuses to build it on CPU."""
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
        self.seen_dtypes = []

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.linear(inputs)
        self.seen_dtypes.append(out.dtype)
        out = out.float().pow(2).mean()
        return dict(loss=out) if mode == 'loss' else out


def _runner(runner_type, work_dir, **ext):
    from mmengine.runner import Runner

    from mmddp_ext.runner.ext_runner import ExtRunner
    cls = dict(ExtRunner=ExtRunner, Runner=Runner)[runner_type]
    return cls(
        model=LinearModel(),
        work_dir=str(work_dir),
        cfg=dict(optim_wrapper=AMP, mmddp_ext_cfg=ext))


def _step(runner, wrapper):
    model = runner.model
    before = model.linear.weight.detach().clone()
    with wrapper.optim_context(model):
        loss = model(torch.ones(2, 3), mode='loss')['loss']
    wrapper.update_params(loss)
    return not torch.equal(before, model.linear.weight)


def _log(runner):
    from mmengine.logging import MMLogger
    return open(MMLogger.get_current_instance().log_file).read()


def test_ext_runner_trains_an_amp_recipe_in_mixed_precision(tmp_path):
    from mmddp_ext.optim import ExtAmpOptimWrapper
    runner = _runner('ExtRunner', tmp_path)
    wrapper = runner.build_optim_wrapper(AMP)
    assert type(wrapper) is ExtAmpOptimWrapper
    # the first steps may overflow the float16 gradient at the initial
    # scale of 65536 (the scaler skips them and halves the scale)
    steps = [_step(runner, wrapper) for _ in range(20)]
    assert any(steps)
    assert steps.index(True) == wrapper.scaler_skipped_steps
    assert runner.model.seen_dtypes == [torch.float16] * 20
    device = 'cuda' if torch.cuda.is_available() else 'cpu'
    assert (f'ExtRunner: training in mixed precision on {device}: float16 '
            'autocast with a loss scaler') in _log(runner)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason='cpu_amp applies to CPU ranks; where CUDA is available the '
    'runner trains on the GPU')
def test_cpu_amp_false_trains_cpu_ranks_in_float32(tmp_path):
    from mmengine.optim import AmpOptimWrapper, OptimWrapper
    runner = _runner('ExtRunner', tmp_path, cpu_amp=False)
    wrapper = runner.build_optim_wrapper(AMP)
    assert type(wrapper) is OptimWrapper
    assert not isinstance(wrapper, AmpOptimWrapper)
    assert _step(runner, wrapper)
    assert runner.model.seen_dtypes == [torch.float32]
    assert ('ExtRunner: training in float32 on cpu '
            '(mmddp_ext_cfg.cpu_amp=False') in _log(runner)


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason='the control is what CPU-only users see: stock AmpOptimWrapper '
    'builds where CUDA is available')
def test_stock_runner_refuses_the_same_recipe_on_cpu(tmp_path):
    """The negative control: what users of an AMP config see on CPU."""
    runner = _runner('Runner', tmp_path)
    with pytest.raises(AssertionError, match='only available training on'):
        runner.build_optim_wrapper(AMP)
