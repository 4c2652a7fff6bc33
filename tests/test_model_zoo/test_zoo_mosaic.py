"""MMDetection's YOLOX-S config (``mmdet::yolox/yolox_s_8xb8-300e_coco.py``)
with the opt-in recipe, trained through ``tools/dist_train.sh`` on 2 gloo
ranks whose rank 1 samples only images without boxes: the zoo's own
Mosaic, RandomAffine, MixUp and YOLOXHSVRandomAug under
``MultiImageMixDataset``, the recipe's training collate
(``empty_gt_guard_collate``, policy ``'keep'``) and the model's
``BatchSyncRandomResize``, shrunk by overrides and the doctor's
``shrink_config`` only (docs/model_zoo_matrix.md).

Overrides beyond sizes: one epoch of 2 iterations, so the zoo's
YOLOXModeSwitchHook (Mosaic and MixUp off for the last 15 epochs) is left
out and BatchSyncRandomResize draws every iteration instead of every 10;
seed 4 (the augmentation draws are exact resume's, from the seed, the
training batch and the sample index).

No mmddp_ext mechanism is what makes this case train, so the test has no
negative control of its own: MixUp draws until it finds an image with
boxes, so no sample reaches YOLOXHead without GT here (YOLOXHead would
keep its branches in the graph with zero-weighted losses if one did), and
BatchSyncRandomResize broadcasts rank 0's size by itself. The test shows
that the recipe (AutoDDP, the guard collate, EmptyGTStatsHook,
RankConsistencyHook) leaves the zoo's mixing pipeline working with a
GT-less rank, and that the pipeline really mixes GT-less images. What it
relies on from mmddp_ext is the doctor's shrink of RandomAffine's border
and of the random-resize range, whose control is in
tests/test_tools/test_doctor_shrink.py.
"""
import math
import re

from mmddp_ext.testing import make_synthetic_coco
from .test_model_zoo_matrix import epoch_iters, launch, rank_logs
from .zoo_cases import (IMAGE_SIZE, ITERS, NUM_IMAGES, WORLD_SIZE,
                        YOLOX_MOSAIC, leaf_config, zoo_config_path, zoo_model)

PROBE = 'tests.test_model_zoo.mosaic_probe'


def _model() -> dict:
    """The shrunk YOLOX, its random resize drawn every iteration (YOLOX's
    interval is 10) so that the broadcast runs within the 2 iterations."""
    model = zoo_model(YOLOX_MOSAIC)
    for augment in model['data_preprocessor']['batch_augments']:
        augment['interval'] = 1
    return model


def _custom_hooks() -> list:
    """The zoo config's own custom hooks (EMA, SyncNorm) but
    YOLOXModeSwitchHook: it switches Mosaic and MixUp off for the last 15
    epochs (of 300), and the one epoch of this run would be one of them."""
    from mmengine.config import Config
    hooks = Config.fromfile(zoo_config_path(YOLOX_MOSAIC.config)).custom_hooks
    return [h.to_dict() for h in hooks if h.type != 'YOLOXModeSwitchHook']


def _losses(log: str) -> list:
    """Each logged iteration's losses, as {name: value}."""
    lines = [
        line for line in log.splitlines()
        if 'Epoch(train)' in line and 'loss: ' in line
    ]
    return [{
        name: float(value)
        for name, value in re.findall(r'\b(loss\w*): (\S+)', line)
    } for line in lines]


def _mixes(probe: str, log: str) -> list:
    """(input box counts, output box count, output size) of each call that
    ``probe`` logged on a rank (tests/test_model_zoo/mosaic_probe.py)."""
    return [([int(n) for n in counts.split(',')], int(out), size)
            for counts, out, size in re.findall(
                rf'{probe}: \[([\d, ]+)\] -> (\d+) boxes (\d+x\d+)', log)]


def test_yolox_mosaic_mixes_gt_less_images_on_two_ranks(tmp_path):
    root = str(tmp_path / 'data')
    make_synthetic_coco(
        root, num_images=NUM_IMAGES, image_size=IMAGE_SIZE, empty='odd')
    config = tmp_path / 'yolox_mosaic_mmddp_ext.py'
    config.write_text(
        leaf_config(
            YOLOX_MOSAIC,
            root,
            extra=dict(
                model=_model(),
                custom_hooks=_custom_hooks(),
                log_level='DEBUG',
                randomness=dict(seed=4),
                custom_imports=dict(
                    imports=[PROBE], allow_failed_imports=False))))
    work_dir = str(tmp_path / 'work')
    result = launch('dist_train.sh', str(config), work_dir)
    logs = rank_logs(work_dir)
    assert result.returncode == 0, result.stdout[-6000:]
    assert sorted(logs) == list(range(WORLD_SIZE)), result.stdout[-3000:]

    losses = {rank: _losses(log) for rank, log in logs.items()}
    for rank, log in logs.items():
        assert epoch_iters(log) == list(range(1, ITERS + 1)), (rank, log)
        assert len(losses[rank]) == ITERS
        assert all(
            math.isfinite(v) for step in losses[rank]
            for v in step.values()), (rank, losses[rank])
        assert 'AutoDDP: find_unused_parameters=False (static)' in log, (
            rank, log[-3000:])
    # The same loss keys on every rank, in every iteration.
    keys = {
        rank: [sorted(step) for step in steps]
        for rank, steps in losses.items()
    }
    assert keys[0][0] == ['loss', 'loss_bbox', 'loss_cls', 'loss_obj']
    assert all(k == [keys[0][0]] * ITERS for k in keys.values()), keys

    mosaics, affines, mixups = ({
        rank: _mixes(probe, log)
        for rank, log in logs.items()
    } for probe in ('MosaicProbe', 'RandomAffineProbe', 'MixUpProbe'))
    for calls in (mosaics, affines, mixups):
        assert all(len(c) == ITERS for c in calls.values()), calls
    # RandomAffine's shrunk border crops the 2x mosaic to YOLOX's
    # img_scale, keeping boxes (with the zoo's -320 px it cuts them all).
    affine_sizes = {size for calls in affines.values() for *_, size in calls}
    assert affine_sizes == {f'{IMAGE_SIZE}x{IMAGE_SIZE}'}, affines
    assert any(out for calls in affines.values() for _, out, _ in calls)
    # Rank 1's sampled image, the first tile of its mosaics, never has a
    # box. Once, its GT-less image is tiled with an image that has boxes,
    # which reach the mosaic; once (with seed 4; seeds 1 to 3 draw no such
    # mosaic), all four tiles are GT-less and so is the mosaic, and MixUp
    # blends it with an image that has boxes (MixUp draws until it finds
    # one). So no sample reached YOLOXHead without GT.
    assert all(tiles[0] == 0 for tiles, _, _ in mosaics[1]), mosaics
    assert any(max(tiles) > 0 and out > 0
               for tiles, out, _ in mosaics[1]), mosaics
    mosaic_size = f'{2 * IMAGE_SIZE}x{2 * IMAGE_SIZE}'
    assert ([0] * 4, 0, mosaic_size) in mosaics[1], mosaics
    assert any(mosaic == 0 and mixed > 0 and out > 0
               for (mosaic, mixed), out, _ in mixups[1]), mixups
    assert f'rank 1: 0/{ITERS} samples without GT' in logs[0], logs[0][-3000:]

    # Every rank resized to the size rank 0 drew and broadcast.
    sizes = {
        rank: re.findall(r'BatchSyncRandomResize: input size (\(\d+, \d+\))',
                         log)
        for rank, log in logs.items()
    }
    assert sizes[0] and all(s == sizes[0] for s in sizes.values()), sizes
