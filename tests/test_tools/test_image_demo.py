"""tools/image_demo.py on the tiny RT-DETR, DEIMv2 and DINO configs: the
drawn image and the predictions JSON in DetInferencer's layout, and which
weights of an EMA checkpoint it uses (the average by default, the raw
weights with ``--no-ema``: the negative control).

The checkpoints are randomly initialised models; the EMA is the model
with its parameters halved, saved through MMEngine's own
``EMAHook.before_save_checkpoint``, so the file has EMAHook's layout."""
import copy
import json
import logging
import os
import os.path as osp
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from ..helpers import REPO_ROOT

FAMILIES = {
    'rtdetr': 'configs/rtdetr_tiny.py',
    'deimv2': 'projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py',
    'dino': 'configs/dino_tiny.py',
}
CLASSES = ('square', 'disc')
# Larger than the test pipeline's 96 x 64, so boxes in the input's pixels
# reach beyond the resized image.
IMAGE_H, IMAGE_W = 160, 240
RESIZED_W = 96
EMA_SCALE = 0.5


@pytest.fixture
def image_demo(monkeypatch):
    """tools/image_demo.py as a module (tools/ is no package)."""
    monkeypatch.syspath_prepend(osp.join(REPO_ROOT, 'tools'))
    import image_demo as module
    return module


@pytest.fixture(scope='module')
def image(tmp_path_factory) -> str:
    """A noise image: any box drawn on it changes its pixels."""
    path = str(tmp_path_factory.mktemp('inputs') / 'street.png')
    pixels = np.random.default_rng(0).integers(
        0, 256, (IMAGE_H, IMAGE_W, 3), dtype=np.uint8)
    cv2.imwrite(path, pixels)
    return path


@pytest.fixture(scope='module', params=list(FAMILIES))
def family(request, tmp_path_factory):
    """A family's config, its ``max_per_img`` and three checkpoints of one
    random model: ``raw.pth`` (no EMA), ``ema.pth`` (EMAHook's layout,
    the EMA = halved parameters) and ``average_only.pth`` (the EMA weights
    as a plain state_dict)."""
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.hooks import EMAHook
    from mmengine.model import ExponentialMovingAverage
    from mmengine.registry import init_default_scope
    config = osp.join(REPO_ROOT, FAMILIES[request.param])
    cfg = Config.fromfile(config)  # imports the config's projects
    init_default_scope('mmdet')
    torch.manual_seed(0)
    model = MODELS.build(copy.deepcopy(cfg.model))
    model.init_weights()  # DINO's level embeddings start uninitialised
    ema = ExponentialMovingAverage(model)
    with torch.no_grad():
        for param in ema.module.parameters():
            param.mul_(EMA_SCALE)
    hook = EMAHook()
    hook.ema_model = ema
    meta = dict(dataset_meta=dict(classes=CLASSES))
    folder = tmp_path_factory.mktemp(request.param)
    paths = {
        name: str(folder / f'{name}.pth')
        for name in ('raw', 'ema', 'average_only')
    }
    torch.save(dict(state_dict=model.state_dict(), meta=meta), paths['raw'])
    torch.save(
        dict(state_dict=ema.module.state_dict(), meta=meta),
        paths['average_only'])
    checkpoint = dict(state_dict=model.state_dict(), meta=meta)
    hook.before_save_checkpoint(None, checkpoint)
    torch.save(checkpoint, paths['ema'])
    return dict(
        name=request.param,
        config=config,
        max_per_img=cfg.model.test_cfg.max_per_img,
        **paths)


class LogLines(logging.Handler):
    """The lines the tool logs through MMEngine's current logger."""

    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())

    def __enter__(self):
        from mmengine.logging import MMLogger
        self.logger = MMLogger.get_current_instance()
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)


def predict(image_demo, inputs, family, weights, *args):
    """Run the tool in-process; returns its predictions and log lines."""
    with LogLines() as log:
        results = image_demo.main([
            inputs, family['config'], '--weights', family[weights], '--device',
            'cpu', '--pred-score-thr', '0', *args
        ])
    return results['predictions'], log.lines


def box_outline(box, shape):
    """Row and column indices of ``box``'s outline, inside the image."""
    h, w = shape
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    x1, x2 = np.clip([x1, x2], 0, w - 1)
    y1, y2 = np.clip([y1, y2], 0, h - 1)
    xs, ys = np.arange(x1, x2 + 1), np.arange(y1, y2 + 1)
    rows = np.concatenate([np.full_like(xs, y1), np.full_like(xs, y2), ys, ys])
    cols = np.concatenate([xs, xs, np.full_like(ys, x1), np.full_like(ys, x2)])
    return rows, cols


def test_draws_boxes_and_writes_predictions(image_demo, image, family,
                                            tmp_path):
    out_dir = str(tmp_path / 'outputs')
    predictions, log = predict(image_demo, image, family, 'ema', '--out-dir',
                               out_dir)

    drawn = cv2.imread(osp.join(out_dir, 'vis', 'street.png'))
    original = cv2.imread(image)
    assert drawn.shape == original.shape
    with open(osp.join(out_dir, 'preds', 'street.json')) as file:
        saved = json.load(file)
    assert saved == pytest.approx(predictions[0])
    labels, scores = saved['labels'], saved['scores']
    bboxes = np.array(saved['bboxes'])
    assert len(labels) == len(scores) == len(bboxes) == family['max_per_img']
    assert set(labels) <= set(range(len(CLASSES)))
    assert all(0 <= score <= 1 for score in scores)
    # In the input's pixels, not the resized image's
    assert np.isfinite(bboxes).all()
    assert (bboxes >= -1e-3).all()
    assert (bboxes[:, [0, 2]] <= IMAGE_W + 1e-3).all()
    assert (bboxes[:, [1, 3]] <= IMAGE_H + 1e-3).all()
    assert bboxes[:, 2].max() > 1.2 * RESIZED_W
    # --pred-score-thr 0: every box is drawn; the best one's outline shows
    rows, cols = box_outline(bboxes[int(np.argmax(scores))],
                             (IMAGE_H, IMAGE_W))
    changed = (drawn[rows, cols] != original[rows, cols]).any(-1)
    assert changed.mean() > 0.9
    assert any('using the EMA weights' in line for line in log), log

    # Negative control: the raw weights predict something else.
    raw, log = predict(image_demo, image, family, 'ema', '--no-ema',
                       '--no-save-vis', '--no-save-pred')
    assert not np.allclose(raw[0]['scores'], scores)
    assert any('using the raw weights' in line for line in log), log


@pytest.mark.parametrize('family', ['rtdetr'], indirect=True)
def test_ema_choice_loads_exactly_those_weights(image_demo, image, family,
                                                tmp_path):
    """Default: the average EMAHook saved as state_dict; --no-ema: the raw
    weights from ema_state_dict; the same as plain checkpoints of each.
    The raw run also reads a folder in a batch of two."""
    average, _ = predict(image_demo, image, family, 'ema', '--no-save-vis',
                         '--no-save-pred')
    expected_average, log = predict(image_demo, image, family, 'average_only',
                                    '--no-save-vis', '--no-save-pred')
    assert average == expected_average
    assert any('no ema_state_dict' in line for line in log), log

    raw, _ = predict(image_demo, image, family, 'ema', '--no-ema',
                     '--no-save-vis', '--no-save-pred')
    folder = tmp_path / 'images'
    folder.mkdir()
    for name in ('a.png', 'b.png'):
        os.symlink(image, folder / name)
    out_dir = tmp_path / 'outputs'
    plain, _ = predict(image_demo, str(folder), family, 'raw', '--batch-size',
                       '2', '--no-save-vis', '--out-dir', str(out_dir))
    assert sorted(os.listdir(out_dir / 'preds')) == ['a.json', 'b.json']
    for prediction in plain:
        assert prediction['labels'] == raw[0]['labels']
        assert prediction['scores'] == pytest.approx(
            raw[0]['scores'], rel=1e-4, abs=1e-6)
    assert average != raw


@pytest.mark.parametrize('family', ['rtdetr'], indirect=True)
def test_refuses_a_checkpoint_of_another_model(image_demo, image, family,
                                               tmp_path):
    state_dict = torch.load(family['raw'], weights_only=True)['state_dict']
    partial = str(tmp_path / 'partial.pth')
    torch.save(
        dict(state_dict={
            k: v
            for k, v in state_dict.items() if not k.startswith('decoder.')
        }), partial)
    with pytest.raises(SystemExit, match='not trained with this config'):
        image_demo.main([image, family['config'], '--weights', partial])


def test_bad_paths_name_the_problem_and_the_fix(image_demo, image, tmp_path):
    config = FAMILIES['rtdetr']
    empty = tmp_path / 'empty'
    empty.mkdir()
    cases = [
        ([image, 'no/such.py'], "config file 'no/such.py' does not exist"),
        ([image, 'ckpt.pth'], 'give the config file as CONFIG and the '
         'checkpoint with --weights'),
        ([image, config, '--weights', 'no.pth'],
         "checkpoint file 'no.pth' \\(--weights\\) does not exist"),
        (['no.png', config], "input 'no.png' does not exist"),
        ([str(empty), config], 'has no image'),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit, match=message):
            image_demo.main(argv)


def test_cli_exits_with_the_message(image):
    """The real command line, refused before anything heavy loads."""
    result = subprocess.run([
        sys.executable, 'tools/image_demo.py', image, FAMILIES['rtdetr'],
        '--weights', 'no_such.pth'
    ],
                            cwd=REPO_ROOT,
                            capture_output=True,
                            text=True,
                            timeout=120)
    assert result.returncode == 1
    assert "image_demo.py: checkpoint file 'no_such.pth'" in result.stderr
