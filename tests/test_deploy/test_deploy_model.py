"""The deploy model without ONNX: what it refuses (other detectors, other
post-processing, a checkpoint of another model, a size mmdet would pad),
which weights it loads (EMA from an EMAHook checkpoint), K and the size
from the config, and that the contract check used by the export tests
fails for a post-processor with another top-k or with normalised boxes.
"""
import ast
import glob
import os.path as osp

import pytest
import torch
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmengine.config import Config

from mmddp_ext.deploy import (DeployModel, build_deploy_model, export_onnx,
                              run_onnxruntime)
from ..helpers import REPO_ROOT
from .deploy_cases import (ORIG_SIZES, as_images, blank, build_detector,
                           captured_log, family_config_file, match_detections,
                           save_checkpoint, scene, upstream_postprocessor)

SIDE = 64


@pytest.fixture(scope='module')
def checkpoints(tmp_path_factory):
    """RT-DETR-tiny's config and two checkpoints of the same random
    weights: ``plain`` and ``ema`` (other averaged weights, saved by
    MMEngine's EMAHook), with their state dicts."""
    tmp = tmp_path_factory.mktemp('deploy_model')
    config = family_config_file('rtdetr')
    detector = build_detector(config)
    plain, ema = str(tmp / 'plain.pth'), str(tmp / 'ema.pth')
    states = dict(
        plain=save_checkpoint(detector, plain, ema=False),
        ema=save_checkpoint(detector, ema, ema=True))
    return dict(config=config, plain=plain, ema=ema, states=states, tmp=tmp)


def _inputs(info):
    height, width = info.input_size
    rgb = [scene(height, width, seed=4), blank(height, width)]
    return as_images(rgb, info.mean, info.std), torch.tensor(ORIG_SIZES)


@pytest.mark.parametrize('config,model_type', [
    ('mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', 'FasterRCNN'),
    ('mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py', 'DINO'),
])
def test_other_detectors_are_refused(config, model_type, tmp_path):
    from tools import export_onnx
    checkpoint = tmp_path / 'unused.pth'
    checkpoint.write_bytes(b'')  # refused before it is read
    with pytest.raises(ValueError) as error:
        export_onnx.main([config, str(checkpoint)])
    message = str(error.value)
    assert f"model.type='{model_type}' cannot be exported" in message
    for family in ('RT-DETR (v1, v2', 'D-FINE', 'DEIM (', 'DEIMv2'):
        assert family in message
    assert not (tmp_path / 'unused.onnx').exists()


def test_head_with_other_postprocessing_is_refused(checkpoints):
    from mmdet.registry import MODELS
    head_type = MODELS.get('RTDETRHead')

    class ClampingHead(head_type):

        def _predict_by_feat_single(self, *args, **kwargs):
            results = super()._predict_by_feat_single(*args, **kwargs)
            results.bboxes = results.bboxes.clamp(min=0)
            return results

    detector = build_detector(checkpoints['config'])
    detector.bbox_head.__class__ = ClampingHead
    with pytest.raises(ValueError, match="'ClampingHead' post-processes"):
        DeployModel(detector, num_top_queries=30)


def test_checkpoint_of_another_model_is_refused(checkpoints):
    deim_rtdetrv2 = family_config_file('deim_rtdetrv2')
    with pytest.raises(ValueError, match="does not match the config's"):
        build_deploy_model(
            deim_rtdetrv2, checkpoints['plain'], size=(SIDE, SIDE))


@pytest.mark.parametrize('kind', ['ema', 'no_ema', 'plain'])
def test_the_ema_weights_are_exported_when_there_are_some(checkpoints, kind):
    """The EMA weights of an EMAHook checkpoint (``ema=False``: the trained
    ones), the only weights of one without EMA; the log says which."""
    states = checkpoints['states']['plain' if kind == 'plain' else 'ema']
    file = checkpoints['plain' if kind == 'plain' else 'ema']
    with captured_log() as log:
        model, info = build_deploy_model(
            checkpoints['config'],
            file,
            size=(SIDE, SIDE),
            ema=kind != 'no_ema')
    loaded = model.detector.state_dict()
    expected, other = ((states['ema'], states['trained']) if kind == 'ema' else
                       (states['trained'], states['ema']))
    assert all(torch.equal(loaded[k], v) for k, v in expected.items())
    if kind != 'plain':
        # the two sets differ, so taking the wrong one fails the check above
        assert not all(torch.equal(loaded[k], v) for k, v in other.items())
    assert info.weights == dict(
        ema='ema', no_ema='trained', plain='model')[kind]
    said = dict(
        ema='EMA weights of', no_ema='trained weights of',
        plain='without EMA')[kind]
    assert any(
        m.startswith('deploy model: ') and said in m for m in log.messages)


def test_k_and_size_come_from_the_config(checkpoints):
    cfg = Config.fromfile(checkpoints['config'])
    cfg.model.test_cfg.max_per_img = 7
    resize = cfg.test_dataloader.dataset.pipeline[1]
    assert resize.type == 'Resize' and resize.keep_ratio
    resize.scale = (128, 96)  # mmdet's (w, h)
    with captured_log() as log:
        model, info = build_deploy_model(cfg, checkpoints['plain'])
    assert info.input_size == (96, 128)
    assert info.num_top_queries == 7
    assert any('K = 7 detections per image, from model.test_cfg' in m
               for m in log.messages)
    assert any('keeps the aspect ratio' in m for m in log.messages)
    labels, boxes, scores = model(*_inputs(info))
    assert labels.shape == scores.shape == (2, 7) and boxes.shape == (2, 7, 4)
    with pytest.raises(ValueError, match='pad_size_divisor=32'):
        build_deploy_model(cfg, checkpoints['plain'], size=(80, 96))


class BestClassTopK(DeployModel):
    """A mistake: the top-k of each query's best class (one detection per
    query at most), not of every (query, class) pair."""

    def postprocess(self, logits, boxes, orig_target_sizes):
        best, labels = logits.sigmoid().max(-1)
        scores, query = best.topk(self.num_top_queries, dim=-1)
        labels = labels.gather(1, query)
        scale = orig_target_sizes.repeat(1, 2).unsqueeze(1)
        corners = bbox_cxcywh_to_xyxy(boxes) * scale
        return labels, corners.gather(1,
                                      query.unsqueeze(-1).expand(-1, -1,
                                                                 4)), scores


class NormalisedBoxes(DeployModel):
    """A mistake: boxes left in normalised units."""

    def postprocess(self, logits, boxes, orig_target_sizes):
        return super().postprocess(logits, boxes,
                                   torch.ones_like(orig_target_sizes))


def test_contract_check_fails_for_wrong_postprocessing(checkpoints):
    model, info = build_deploy_model(
        checkpoints['config'], checkpoints['plain'], size=(SIDE, SIDE))
    images, sizes = _inputs(info)
    k = Config.fromfile(checkpoints['config']).model.test_cfg.max_per_img
    with torch.no_grad():
        # Both classes scored alike, as overlapping classes of a trained
        # detector are: the top-k of (query, class) pairs then keeps both
        # classes of a query (with random weights one class's prior bias
        # wins every query, and the best-class top-k would pass).
        for branch in model.detector.bbox_head.cls_branches:
            branch.weight[1] = branch.weight[0]
            branch.bias[1] = branch.bias[0] - 1e-3
        logits, boxes = model.detector(images, mode='tensor')
        expected = upstream_postprocessor(logits[-1], boxes[-1], sizes, k)
        match_detections(model(images, sizes), expected, sizes)
        mistakes = [
            (BestClassTopK(model.detector, k), 'no detection of label'),
            (DeployModel(model.detector, k - 1), 'shape'),
            (NormalisedBoxes(model.detector, k), 'no detection of label'),
        ]
        for mistake, failure in mistakes:
            with pytest.raises(AssertionError, match=failure):
                match_detections(mistake(images, sizes), expected, sizes)


def test_mmddp_ext_imports_onnx_only_when_exporting():
    """No module of the package imports onnx, onnxruntime or onnxsim at
    import time (they are the optional ``deploy`` extra): only inside
    functions. Read from the sources (a fresh interpreter importing
    mmddp_ext costs 6 to 20 s here)."""
    optional = {'onnx', 'onnxruntime', 'onnxsim', 'onnxscript'}
    found = []
    for path in glob.glob(
            osp.join(REPO_ROOT, 'mmddp_ext', '**', '*.py'), recursive=True):
        with open(path) as f:
            tree = ast.parse(f.read())
        for node in _module_level(tree.body):
            names = ([a.name for a in node.names] if isinstance(
                node, ast.Import) else [node.module or ''])
            found += [(osp.relpath(path, REPO_ROOT), name) for name in names
                      if name.split('.')[0] in optional]
    assert found == []
    # the check sees a module-level import
    planted = ast.parse('import os\nif True:\n    import onnxruntime\n')
    assert len(list(_module_level(planted.body))) == 2


def _module_level(body):
    """The import statements run when a module is imported: at the top
    level and inside its if / try / with blocks, not in functions or
    classes."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ('body', 'orelse', 'finalbody', 'handlers'):
                for child in getattr(node, block, []):
                    yield from _module_level(
                        child.body if isinstance(child, ast.ExceptHandler
                                                 ) else [child])


def test_export_after_the_weights_changed(checkpoints, tmp_path):
    """Weights loaded into a built deploy model (the ports' caches of
    folded conv + BatchNorm weights are then stale) export as they are:
    a fold traced from the parameters made convolutions whose kernels
    have no static shape, which the exporter refused."""
    model, info = build_deploy_model(
        checkpoints['config'], checkpoints['plain'], size=(SIDE, SIDE))
    averaged = checkpoints['states']['ema']['ema']
    model.detector.load_state_dict(averaged)
    path = export_onnx(model, info, str(tmp_path / 'reloaded.onnx'))
    images, sizes = _inputs(info)
    with torch.no_grad():
        expected = model(images, sizes)
    match_detections(
        run_onnxruntime(path, images.cpu().numpy(), sizes.cpu().numpy()),
        expected, sizes)


def test_a_model_trained_on_bgr_takes_rgb(checkpoints):
    """A config whose data preprocessor converts no channels trained on
    BGR as loaded; the deploy model keeps upstream's RGB input and flips
    it (logged)."""
    cfg = Config.fromfile(checkpoints['config'])
    preprocessor = cfg.model.data_preprocessor
    preprocessor.bgr_to_rgb = False
    with captured_log() as log:
        model, info = build_deploy_model(
            cfg, checkpoints['plain'], size=(SIDE, SIDE))
    assert any('trained on BGR' in m for m in log.messages)
    # the config's mean and std apply to the BGR channels it was trained on
    assert info.mean == pytest.approx([m / 255
                                       for m in preprocessor.mean][::-1])
    images, sizes = _inputs(info)
    rgb_model = DeployModel(model.detector, info.num_top_queries)
    with torch.no_grad():
        # what the detector was trained on: BGR, normalised per channel
        expected = rgb_model(images.flip(1), sizes)
        match_detections(model(images, sizes), expected, sizes)
        with pytest.raises(AssertionError):
            match_detections(rgb_model(images, sizes), expected, sizes)
