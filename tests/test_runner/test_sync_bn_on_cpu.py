"""``sync_bn`` (RT-DETR's configs set it, as upstream) on CPU gloo ranks:
ExtRunner skips it with a warning; stock conversion breaks the forward.
The same ranks show ExtRunner's ``device_ids`` on CPU (None; stock's
``[LOCAL_RANK]`` makes DDP refuse a CPU model)."""
import os

import pytest
import torch
import torch.nn as nn
from mmengine.model import BaseModel

from mmddp_ext.launch.rank_launcher import RANK_DEVICE_ENV
from mmddp_ext.testing import run_on_ranks


class BatchNormModel(BaseModel):

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        out = self.bn(self.conv(inputs)).mean()
        return dict(loss=out) if mode == 'loss' else out


def _forward_on_rank(work_dir):
    """ExtRunner's wrapped model, then stock MMEngine's conversion of the
    same model: (ExtRunner's BatchNorm types, its forward, stock's error)."""
    from mmengine.logging import MMLogger
    from mmengine.model import convert_sync_batchnorm

    from mmddp_ext.runner.ext_runner import ExtRunner
    runner = ExtRunner(
        model=BatchNormModel(),
        work_dir=f'{work_dir}/{torch.distributed.get_rank()}',
        launcher='pytorch',
        cfg=dict(sync_bn='torch'))
    kinds = sorted({type(m).__name__ for m in runner.model.modules()
                    if isinstance(m, nn.modules.batchnorm._BatchNorm)})
    runner.model.train()
    finite = bool(torch.isfinite(runner.model(torch.rand(2, 3, 8, 8))))
    # MMEngine writes the log file on rank 0 only.
    logger = MMLogger.get_current_instance()
    log = open(logger.log_file).read() if runner.rank == 0 else None
    stock = convert_sync_batchnorm(BatchNormModel(), 'torch').train()
    try:
        stock(torch.rand(2, 3, 8, 8))
        stock_error = None
    except ValueError as error:
        stock_error = str(error)
    # Stock Runner.wrap_model's device_ids, for a model on the CPU.
    from torch.nn.parallel import DistributedDataParallel
    try:
        DistributedDataParallel(
            BatchNormModel(), device_ids=[int(os.environ['LOCAL_RANK'])])
        stock_ids_error = None
    except ValueError as error:
        stock_ids_error = str(error)
    return kinds, finite, log, stock_error, stock_ids_error


@pytest.mark.skipif(
    os.environ.get(RANK_DEVICE_ENV) == 'cuda',
    reason='about CPU ranks; on GPU ranks ExtRunner applies sync_bn, and '
    "torch's SyncBatchNorm needs NCCL (gloo, which run_on_ranks starts, "
    'all-gathers no CUDA tensors)')
def test_sync_bn_is_skipped_on_cpu_ranks_where_stock_breaks(tmp_path):
    results = run_on_ranks(_forward_on_rank, 2, args=(str(tmp_path), ),
                           timeout=90)
    assert "sync_bn='torch' skipped" in results[0][2]
    for kinds, finite, _, stock_error, stock_ids_error in results:
        assert kinds == ['BatchNorm2d'] and finite
        # The negative control: what stock's conversion gives on CPU.
        assert 'SyncBatchNorm expected input tensor to be on GPU' in \
            stock_error
        # ExtRunner wrapped the CPU model in DDP (device_ids=None, from
        # ddp_setup.resolve_ddp_setup); stock's [LOCAL_RANK] is refused.
        assert ('DistributedDataParallel device_ids and output_device '
                'arguments only work with single-device/multiple-device GPU '
                'modules or CPU modules') in stock_ids_error
