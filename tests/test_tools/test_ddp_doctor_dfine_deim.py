"""Doctor against reality for the D-FINE and DEIM ports (issue 30).

- The shipped custom configs of the smallest size of each model family
  (``*_n_custom.py``, whose encoder uses strides 16 and 32 only: the
  fewest tokens among which the two-stage decoder picks its queries; and
  DEIM-RTDETRv2-r18vd, DEIM on the RT-DETRv2 port) are asked as a user
  asks them: data placeholders filled, ``--shrink`` for the rest. Each agrees
  with a real 2-rank ``tools/dist_train.sh`` run of the same config in
  which rank 1 only reads images without boxes (shrunk as
  test_custom_configs_train shrinks it); D-FINE-N's real runs are those
  of test_dfine_dist.py and test_custom_configs_train.py. The other sizes
  share the code that decides DDP behaviour (detector, head, decoder,
  losses, DDP set-up) and differ in widths, depths and levels only.
- Upstream D-FINE's empty-batch behaviour (no denoising queries on a
  GT-less rank; ``DFINEUpstreamEmptyDn`` of the D-FINE tests) is a
  blocker, and the same tiny config with the port's head is ok; the real
  runs are those tests/test_projects/test_dfine/test_dfine_dist.py makes:
  the port trains with a GT-less rank (``test_rank_with_only_empty_images``)
  and the upstream behaviour hangs until the collective timeout
  (``test_upstream_empty_batch_behaviour_hangs``).
"""
import os.path as osp
import re

import pytest
from mmengine.config import Config

from ..helpers import REPO_ROOT
from ..test_configs.test_custom_configs_train import placeholder_options
from ..test_projects.test_dfine.dfine_utils import TINY_CONFIG
from .test_ddp_doctor_matrix import _doctor, _real, data  # noqa: F401

CUSTOM = {
    'D-FINE': 'projects/D-FINE/configs/dfine_hgnetv2_n_custom.py',
    'DEIM': 'projects/DEIM/configs/deim_hgnetv2_n_custom.py',
    'DEIM-RTDETRv2': 'projects/DEIM/configs/deim_rtdetrv2_r18vd_custom.py',
}
# What a user fills in before asking: the data, classes and start
# weights; sizes and query counts are left to --shrink.
USER_KEYS = ('data_root', 'ann_file', 'data_prefix', 'metainfo',
             'evaluator', 'load_from', 'init_cfg', 'train_dataloader.')


def _as_a_user_fills_it(options: dict) -> dict:
    return {
        key: value
        for key, value in options.items()
        if any(k in key for k in USER_KEYS) and '.pipeline.' not in key
    }


@pytest.mark.parametrize('project', sorted(CUSTOM))
def test_smallest_custom_config_agrees_with_its_run(
        project, data, tmp_path):  # noqa: F811
    """The real runs are made for DEIM-N, whose head (MAL) and recipe add
    to D-FINE-N's, and for DEIM-RTDETRv2-r18vd (RT-DETRv2's head and
    decoder with MAL and DEIM's recipe); D-FINE-N's decoder and losses
    train with a GT-less rank in test_dfine_dist.py, and its custom config
    trains one step in test_custom_configs_train.py (the suite's time
    budget). The real runs train in float32 (``mmddp_ext_cfg.cpu_amp=False``:
    float16 convolutions run about 20 times slower on this CPU), as the
    graph, the collectives and the DDP set-up the verdict is about are the
    same in both; the recipes' AMP runs with a GT-less rank are
    tests/test_amp's."""
    config = osp.join(REPO_ROOT, CUSTOM[project])
    options = placeholder_options(Config.fromfile(config), data, batch_size=1)
    doctor, report = _doctor(config, _as_a_user_fills_it(options),
                             shrink=True)
    assert doctor == 0 and 'BLOCKER' not in report, report[-3000:]
    # the recipe's AMP is probed as AMP (its float16 autocast on the CPU);
    # the report's table wraps the text inside cell borders
    flat = ' '.join(re.sub(r'[\u2500-\u257f]', ' ', report).split())
    assert 'AMP ran as float16 autocast on the CPU' in flat, report[-3000:]
    if project.startswith('DEIM'):
        real, out = _real(config,
                          dict(options, **{'mmddp_ext_cfg.cpu_amp': False}),
                          str(tmp_path / 'work'))
        assert real == 0, out[-3000:]


def test_upstream_empty_batch_behaviour_is_a_blocker(
        data, tmp_path):  # noqa: F811
    options = {
        'custom_imports.imports': [
            'projects.D-FINE.dfine', 'tests.test_projects.test_dfine.ddp_probe'
        ],
        'train_dataloader.sampler.shuffle': False,
        'train_dataloader.batch_size': 1,
    }
    options.update(
        _as_a_user_fills_it(
            placeholder_options(
                Config.fromfile(TINY_CONFIG), data, batch_size=1)))
    port, port_report = _doctor(TINY_CONFIG, options)
    assert port == 0, port_report[-3000:]
    upstream, report = _doctor(TINY_CONFIG,
                               dict(options, **{'model.type':
                                                'DFINEUpstreamEmptyDn'}))
    assert upstream == 1, report[-3000:]
    assert 'BLOCKER' in report


def test_a_query_cap_above_the_token_count_is_the_false_blocker(
        data, tmp_path):  # noqa: F811
    """Negative control: ``--shrink`` capping queries at 100 (as before)
    gives DEIM-N more queries than its 80 tokens at 128 px, and the doctor
    blocks a config that trains (the real run of the test above)."""
    from mmddp_ext.doctor import render, run_doctor, shrink_config
    config = osp.join(REPO_ROOT, CUSTOM['DEIM'])
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(
        _as_a_user_fills_it(placeholder_options(cfg, data, batch_size=1)))
    shrink_config(cfg, max_queries=100)
    report = run_doctor(cfg, osp.basename(config), nproc=2, iters=1,
                        gradients=False, timeout=120)
    assert report.exit_code == 1
    assert 'selects num_queries=100 of the 80 feature tokens' in render(
        report)
