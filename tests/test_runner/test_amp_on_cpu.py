"""``AmpOptimWrapper`` (RT-DETRv2's, D-FINE's and DEIM's configs set it,
as upstream trains with AMP) on a machine without an accelerator:
ExtRunner trains with a plain ``OptimWrapper`` and says so; stock
MMEngine refuses to start."""
import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.runner import Runner
from torch.utils.data import Dataset

from mmddp_ext.runner import ExtRunner

AMP = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    optimizer=dict(type='SGD', lr=0.1),
    clip_grad=dict(max_norm=0.1))


class Points(Dataset):

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return dict(inputs=torch.tensor([float(index), 1.0]))


class Linear(BaseModel):

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(2, 1)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        return dict(loss=self.linear(torch.stack(inputs)).pow(2).mean())


def _train(runner_type, work_dir):
    runner = runner_type(
        model=Linear(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=Points(),
            sampler=dict(type='DefaultSampler', shuffle=False),
            batch_size=2,
            num_workers=0),
        optim_wrapper=dict(AMP),
        train_cfg=dict(by_epoch=False, max_iters=2),
        default_hooks=dict(checkpoint=None),
        experiment_name=f'amp_{runner_type.__name__}')
    runner.train()
    return runner


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU behaviour')
def test_ext_runner_trains_amp_configs_on_cpu_in_fp32(tmp_path, caplog):
    runner = _train(ExtRunner, tmp_path)
    assert runner.iter == 2
    wrapper = runner.optim_wrapper
    assert type(wrapper) is OptimWrapper
    assert not isinstance(wrapper, AmpOptimWrapper)
    assert wrapper.clip_grad_kwargs == dict(max_norm=0.1)
    with open(runner.logger.log_file) as f:
        assert 'AmpOptimWrapper runs as a plain OptimWrapper' in f.read()


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU behaviour')
def test_stock_runner_refuses_amp_on_cpu(tmp_path):
    """Negative control: stock MMEngine's AMP wrapper refuses CPU."""
    with pytest.raises(AssertionError, match='only available training on'):
        _train(Runner, tmp_path)
