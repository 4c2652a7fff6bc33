"""Doctor against reality: for the configs the package ships and the
model-zoo matrix's configs without the opt-in, the doctor's exit code
agrees with a real 2-rank run of ``tools/train.py`` as
``tools/dist_train.sh`` starts it (torchrun's environment, ``--launcher
pytorch``; ranks forked with their imports done, see
``tests/helpers.py::train_on_ranks``) in which rank 1 only ever reads images
without boxes.

What is compared is whether the run trains (exit 0) or stops, crashes or
hangs (non-zero): the doctor runs without its gradient comparison
(``--no-gradients``), whose blocker means "trains, but not as one process
over the whole batch", which no exit code shows (its own tests are in
test_ddp_doctor.py and test_ddp_doctor_predictions.py). The doctor runs
two iterations of its schedule: every rank with GT, then the last rank
without.

Real runs, and which configs share one (the shipped configs are grouped
by the code that decides DDP behaviour: the resolved DDP set-up, the
detector and its loss heads; backbone, depth, image size, schedule and
data differ within a group, and the doctor itself is run on the group's
representative with the real run's options):

- DINO (``configs/dino_tiny.py``) and DDP-safe DINO
  (``configs/dino_tiny_ddp_safe.py``): a real run each, here.
- RT-DETR (``configs/rtdetr_tiny.py`` and the 15 ``projects/RT-DETR``
  configs: RTDETR, RTDETRHead, HybridEncoder, AutoDDP, EMAHook, v2's
  augment-stop hook acts after the first epochs): one real run here, of
  ``rtdetr_r18vd_custom.py`` shrunk as test_custom_configs_train shrinks
  it; the doctor runs it with ``--shrink`` on top, as the issue's command
  did (that config was the false blocker).
- CO-DINO (``configs/co_dino_ext*.py``, ``co_dino_tiny.py`` and the 9
  ``projects/CO-DETR`` configs: CoDETR, CoDINOHead, CoStandardRoIHead,
  CoATSSHead, AutoDDP, encoder checkpointing): two real runs that other
  tests already make and assert (exit 0): ``co_dino_ext_custom.py`` with
  test_custom_configs_train's shrink
  (tests/test_configs/test_custom_configs_train.py::
  test_co_dino_ext_custom_trains_on_two_ranks) and the upstream LSJ config
  with BatchFixedSizePad (tests/test_projects/test_codetr/
  test_co_dino_lsj_dist_train.py::
  test_upstream_lsj_config_trains_on_two_ranks_one_without_gt); the
  doctor runs on both with the same options, no new real run.
- The model-zoo matrix (tests/test_model_zoo/zoo_cases.py) without the
  opt-in: a real run each, here, and the doctor on the same leaf config,
  for one config that stops and one that trains: Conditional DETR (a
  parameter no layer uses: both stop) and RetinaNet ResNeXt with
  ``with_cp`` (checkpointed blocks: both train). Until 2026-11-27 all 9
  zoo configs ran, until 2026-11-28 the CO-DETR-style config too, until
  2026-11-29 DINO and Mask R-CNN, all with the same verdicts; they were
  left out for the
  suite's time budget, as configs whose DDP-deciding code runs in the
  doctor's other tests: stock DINO's head with a GT-less rank in
  test_ddp_doctor.py and tests/test_models/test_detectors/
  test_ddp_safe_dino_dist.py, a two-stage R-CNN trains like the dense
  RetinaNet under stock DDP (every head used on every rank), and
  CO-DINO's auxiliary heads against the real runs above.
"""
import os.path as osp
import re
from typing import Dict

import pytest
from mmengine.config import Config

from mmddp_ext.testing import make_synthetic_coco
from ..helpers import REPO_ROOT, data_overrides, train_on_ranks
from ..test_configs.test_custom_configs_train import (CLASSES,
                                                      CO_DINO_SHRINK,
                                                      placeholder_options)
from ..test_configs.test_custom_configs_train import \
    as_cli as spell_options
from ..test_model_zoo.zoo_cases import (CASES, IMAGE_SIZE, NUM_IMAGES,
                                        RECIPE, leaf_config)
from ..test_projects.test_codetr.test_co_dino_lsj_dist_train import (
    COCO_NAMES, LSJ_CONFIG, _shrink, _with_box_masks)

ITERS = 2  # every rank with GT; the last rank without
DOCTOR_TIMEOUT_S = 300
REAL_TIMEOUT_S = 200


@pytest.fixture(scope='module')
def data(tmp_path_factory) -> str:
    """train/ (4 images, the odd ones empty: unshuffled on 2 ranks, rank 1
    reads only those) and val/."""
    root = str(tmp_path_factory.mktemp('matrix'))
    make_synthetic_coco(
        osp.join(root, 'train'), num_images=NUM_IMAGES,
        image_size=IMAGE_SIZE, classes=CLASSES, empty='odd')
    make_synthetic_coco(
        osp.join(root, 'val'), num_images=2, image_size=IMAGE_SIZE,
        classes=CLASSES, seed=1)
    return root


def _doctor(config: str, options: Dict, shrink: bool = False):
    """The doctor's report, run as tools/ddp_doctor.py runs it (in this
    process: its imports are paid once)."""
    from mmddp_ext.doctor import render, run_doctor, shrink_config
    cfg = Config.fromfile(config)
    cfg.merge_from_dict(options)
    if shrink:
        shrink_config(cfg)
    report = run_doctor(cfg, osp.basename(config), nproc=2, iters=ITERS,
                        gradients=False, timeout=DOCTOR_TIMEOUT_S)
    text = render(report)
    assert report.exit_code in (0, 1), text[-4000:]  # 2: doctor failed
    return report.exit_code, text


def _real(config: str, options: Dict, work_dir: str) -> int:
    """The real run: ``tools/train.py`` on 2 ranks as ``dist_train.sh``
    starts it, its ranks forked with their imports done
    (:func:`train_on_ranks`: the verdict is about the training, and the
    launcher's own runs are test_dist_train's and the zoo matrix's)."""
    result = train_on_ranks(config, 2, work_dir, spell_options(options),
                            timeout=REAL_TIMEOUT_S)
    if result.returncode == 0:  # a run that trained logged its iterations
        assert re.search(r'(Iter|Epoch)\(train\) \[', result.stdout), (
            result.stdout[-3000:])
    return result.returncode, result.stdout


def _tiny_dino_options(root: str) -> Dict:
    return dict(
        data_overrides(root), **{
            'train_cfg.max_iters': 2,
            'train_cfg.val_interval': 3,
            'param_scheduler.1.end': 2,
            'default_hooks.checkpoint': None,
            'train_dataloader.batch_size': 1,
            'train_dataloader.sampler.shuffle': False,
        })


def _rtdetr_options(root: str) -> Dict:
    config = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                      'rtdetr_r18vd_custom.py')
    return placeholder_options(Config.fromfile(config), root, batch_size=1)


@pytest.mark.parametrize('name', ['dino_tiny', 'dino_tiny_ddp_safe'])
def test_shipped_dino_configs(name, data, tmp_path):
    config = osp.join(REPO_ROOT, 'configs', f'{name}.py')
    options = _tiny_dino_options(data)
    doctor, report = _doctor(config, options)
    real, out = _real(config, options, str(tmp_path / 'work'))
    assert (doctor, real) == (0, 0), report[-3000:] + out[-3000:]


def test_shipped_rtdetr_configs(data, tmp_path):
    """rtdetr_r18vd_custom.py, the issue's false blocker ("TypeError:
    unsupported operand type(s) for +: 'NoneType' and 'int'": the
    probe ran the data preprocessor's BatchSyncRandomResize outside the
    train loop, which sets the iteration it reads)."""
    config = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                      'rtdetr_r18vd_custom.py')
    options = _rtdetr_options(data)
    doctor, report = _doctor(config, options, shrink=True)
    real, out = _real(config, options, str(tmp_path / 'work'))
    assert (doctor, real) == (0, 0), report[-3000:] + out[-3000:]
    assert 'NoneType' not in report


def test_shipped_co_dino_configs_against_their_runs(data, tmp_path):
    """The doctor on the two CO-DINO runs other tests make (exit 0, see the
    module docstring), with their options."""
    custom = osp.join(REPO_ROOT, 'configs', 'co_dino_ext_custom.py')
    options = dict(
        placeholder_options(Config.fromfile(custom), data, batch_size=1),
        **CO_DINO_SHRINK)
    doctor, report = _doctor(custom, options)
    assert doctor == 0, report[-4000:]

    root = str(tmp_path / 'lsj')
    make_synthetic_coco(osp.join(root, 'train'), num_images=8,
                        classes=COCO_NAMES, empty='odd')
    _with_box_masks(osp.join(root, 'train', 'annotations.json'))
    doctor, report = _doctor(LSJ_CONFIG, _shrink(root))
    assert doctor == 0, report[-4000:]


DOCTOR_CASES = [
    c for c in CASES
    if c.name in ('conditional_detr', 'retinanet_x101_with_cp')
]


@pytest.mark.parametrize(
    'case', DOCTOR_CASES, ids=[c.name for c in DOCTOR_CASES])
def test_zoo_configs_without_the_opt_in(case, data, tmp_path):
    text = leaf_config(case, osp.join(data, 'train'))
    recipe_base = repr([case.config, RECIPE])
    assert recipe_base in text
    config = tmp_path / f'{case.name}_stock.py'
    config.write_text(text.replace(recipe_base, repr([case.config])))
    doctor, report = _doctor(str(config), {})
    real, out = _real(str(config), {}, str(tmp_path / 'work'))
    assert (doctor != 0) == (real != 0), (
        f'doctor {doctor}, real run {real}\n' + report[-3000:] +
        out[-3000:])
