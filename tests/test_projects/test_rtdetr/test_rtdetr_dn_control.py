"""The seed failure of this package, on real gloo ranks: RT-DETR under
``DistributedDataParallel(find_unused_parameters=False)`` with one rank
whose batch has no GT.

One 2-rank spawn runs the port as it is (DDP-safe denoising: the GT-less
rank gets the dummy dn group) and then the negative control, the same
model whose generator gives a GT-less batch what official RT-DETR v1
gives it: no dn part at all. The control runs last, on a process group
of its own with a short collective timeout (``control_step_report``).
"""
import pytest

from mmddp_ext.testing import run_on_ranks
from ...test_models.dino_utils import (
    V1StyleCriterion, V1StyleDnGenerator,
    check_port_gives_the_gt_less_rank_a_dummy_group,
    check_v1_style_gt_less_rank_breaks_ddp, control_step_report,
    ddp_step_report, raw_batch, record_generator_calls, swap_behaviour)
from .rtdetr_utils import build_tiny

EMPTY_RANK = 1
GT_COUNTS = [[2, 1], [0, 0]]
CONTROL_TIMEOUT_S = 15


def _rank_main():
    import torch.distributed as dist
    rank = dist.get_rank()
    batch = raw_batch(GT_COUNTS[rank], first_index=2 * rank)
    model = build_tiny(deterministic=True)
    calls = record_generator_calls(model.dn_query_generator)
    port = ddp_step_report(model, batch)
    port.pop('grads')
    v1 = build_tiny(deterministic=True)
    swap_behaviour(v1.dn_query_generator, V1StyleDnGenerator)
    swap_behaviour(v1.bbox_head, V1StyleCriterion)
    v1_calls = record_generator_calls(v1.dn_query_generator)
    control = control_step_report(v1, batch, CONTROL_TIMEOUT_S)
    return dict(port=port, port_dn=calls, v1=control, v1_dn=v1_calls)


@pytest.fixture(scope='module')
def dn_run():
    return run_on_ranks(_rank_main, 2, timeout=150)


def test_port_gives_the_gt_less_rank_a_dummy_group(dn_run):
    check_port_gives_the_gt_less_rank_a_dummy_group(dn_run, EMPTY_RANK)


def test_v1_style_gt_less_rank_breaks_ddp(dn_run):
    check_v1_style_gt_less_rank_breaks_ddp(dn_run, EMPTY_RANK)
