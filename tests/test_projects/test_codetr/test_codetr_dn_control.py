"""DDP-safe denoising of the CO-DINO port and its negative control, on 2
real gloo ranks under ``DistributedDataParallel(find_unused_parameters=
False)`` with one rank whose batch has no GT.

One spawn runs the port as it is (the GT-less rank gets the dummy dn
group) and then, last and on a process group of its own with a short
collective timeout (``control_step_report``), the same model whose query
head's generator gives a GT-less batch no dn part at all, as a v1-style
port does.
"""
import pytest

from mmddp_ext.testing import run_on_ranks
from ...test_models.dino_utils import (
    V1StyleCriterion, V1StyleDnGenerator,
    check_port_gives_the_gt_less_rank_a_dummy_group,
    check_v1_style_gt_less_rank_breaks_ddp, control_step_report,
    ddp_step_report, raw_batch, record_generator_calls, swap_behaviour)
from .codetr_utils import build_tiny, tiny_model_cfg

EMPTY_RANK = 1
GT_COUNTS = [[2, 1], [0, 0]]
CONTROL_TIMEOUT_S = 15


def _rank_main():
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    rank = dist.get_rank()
    batch = raw_batch(GT_COUNTS[rank], first_index=2 * rank)
    model = build_tiny(tiny_model_cfg())
    calls = record_generator_calls(model.query_head.dn_generator)
    port = ddp_step_report(model, batch)
    port.pop('grads')
    control_model = build_tiny(tiny_model_cfg())
    swap_behaviour(control_model.query_head.dn_generator, V1StyleDnGenerator)
    swap_behaviour(control_model.query_head, V1StyleCriterion)
    control_calls = record_generator_calls(
        control_model.query_head.dn_generator)
    control = control_step_report(control_model, batch, CONTROL_TIMEOUT_S)
    return dict(port=port, port_dn=calls, v1=control, v1_dn=control_calls)


@pytest.fixture(scope='module')
def dn_run():
    return run_on_ranks(_rank_main, 2, timeout=150)


def test_port_gives_the_gt_less_rank_a_dummy_group(dn_run):
    check_port_gives_the_gt_less_rank_a_dummy_group(dn_run, EMPTY_RANK)


def test_v1_style_gt_less_rank_breaks_ddp(dn_run):
    check_v1_style_gt_less_rank_breaks_ddp(dn_run, EMPTY_RANK)
