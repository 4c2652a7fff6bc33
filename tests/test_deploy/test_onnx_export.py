"""tools/export_onnx.py on the tiny twin of each real-time DETR family
(RT-DETR, D-FINE, DEIM's HGNetv2 and RT-DETRv2 models, DEIMv2): the graph
has upstream's contract, ONNX Runtime returns what the PyTorch deploy
model returns (batches of 1 and 2, a blank image among them), and the
deploy model returns upstream's post-processing of the detector's outputs
and what the port's own mmdet ``predict`` returns, in original pixels.

One export per family (a module-scoped fixture); the measured differences
are printed (``pytest -s``) and listed in docs/deploy.md."""
import json
import types

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from mmdet.structures import DetDataSample
from mmengine.config import Config

from mmddp_ext.deploy import (BATCH_AXIS, INPUT_NAMES, OUTPUT_NAMES,
                              build_deploy_model)
from .deploy_cases import (FAMILIES, ORIG_SIZES, as_images, blank,
                           build_detector, family_config_file,
                           match_detections, save_checkpoint, scene,
                           upstream_postprocessor)


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def exported(request, tmp_path_factory):
    """The family's random checkpoint exported with tools/export_onnx.py,
    and the deploy model of the same config and checkpoint."""
    from tools import export_onnx
    name = request.param
    family = FAMILIES[name]
    tmp = tmp_path_factory.mktemp(name)
    config = family_config_file(name)
    checkpoint = str(tmp / 'random.pth')
    save_checkpoint(build_detector(config), checkpoint, ema=family.ema)
    side = family.side
    size = [] if side is None else ['--size', str(side), str(side)]
    path = export_onnx.main(
        [config, checkpoint, '--output',
         str(tmp / f'{name}.onnx'), *size])
    model, info = build_deploy_model(
        config, checkpoint, size=None if side is None else (side, side))
    session = ort.InferenceSession(path, providers=['CPUExecutionProvider'])
    return types.SimpleNamespace(
        name=name,
        config=config,
        path=path,
        model=model,
        info=info,
        session=session)


def _batch(exported, count: int):
    """``count`` test images (the last one blank when there are two) at
    the model's size, their ``images`` input and original sizes."""
    height, width = exported.info.input_size
    rgb = [scene(height, width, seed=3)]
    if count == 2:
        rgb.append(blank(height, width))
    sizes = torch.tensor(ORIG_SIZES[:count])
    return rgb, as_images(rgb, exported.info.mean, exported.info.std), sizes


def test_graph_has_upstreams_contract(exported):
    proto = onnx.load(exported.path)
    onnx.checker.check_model(proto)
    k = exported.info.num_top_queries
    height, width = exported.info.input_size

    def signature(values):
        return [(v.name, v.type.tensor_type.elem_type, [
            d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim
        ]) for v in values]

    float32, int64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    assert signature(proto.graph.input) == [
        ('images', float32, [BATCH_AXIS, 3, height, width]),
        ('orig_target_sizes', int64, [BATCH_AXIS, 2]),
    ]
    assert signature(proto.graph.output) == [
        ('labels', int64, [BATCH_AXIS, k]),
        ('boxes', float32, [BATCH_AXIS, k, 4]),
        ('scores', float32, [BATCH_AXIS, k]),
    ]
    assert (INPUT_NAMES, OUTPUT_NAMES) == (('images', 'orig_target_sizes'),
                                           ('labels', 'boxes', 'scores'))
    assert [p.version for p in proto.opset_import if not p.domain] == [17]
    metadata = {p.key: p.value for p in proto.metadata_props}
    assert metadata['num_top_queries'] == str(k)
    assert json.loads(metadata['input_size']) == [height, width]
    assert json.loads(metadata['mean']) == pytest.approx(exported.info.mean)
    assert metadata['weights'] == ('ema'
                                   if FAMILIES[exported.name].ema else 'model')


@pytest.mark.parametrize('count', [1, 2])
def test_onnxruntime_matches_pytorch(exported, count):
    _, images, sizes = _batch(exported, count)
    with torch.no_grad():
        expected = exported.model(images, sizes)
    actual = exported.session.run(
        list(OUTPUT_NAMES), {
            'images': images.cpu().numpy(),
            'orig_target_sizes': sizes.cpu().numpy()
        })
    found = match_detections(actual, expected, sizes)
    print(f'\n{exported.name} ORT vs PyTorch, batch {count}: {found}')


def test_deploy_model_is_upstreams_postprocessing(exported):
    _, images, sizes = _batch(exported, 2)
    # K as the config sets it, read here from the file itself
    k = Config.fromfile(exported.config).model.test_cfg.max_per_img
    with torch.no_grad():
        logits, boxes = exported.model.detector(images, mode='tensor')
        expected = upstream_postprocessor(logits[-1], boxes[-1], sizes, k)
        actual = exported.model(images, sizes)
    found = match_detections(actual, expected, sizes)
    assert found['score'] == 0.0 and found['in_order']


def test_deploy_model_matches_mmdet_predict(exported):
    """The port's own predict path (data preprocessor from uint8 BGR,
    ``predict``, boxes mapped back through ``scale_factor``) on the same
    resized images returns the deploy model's detections."""
    rgb, images, sizes = _batch(exported, 2)
    height, width = exported.info.input_size
    samples = []
    for orig_w, orig_h in sizes.tolist():
        samples.append(
            DetDataSample(
                metainfo=dict(
                    img_shape=(height, width),
                    ori_shape=(orig_h, orig_w),
                    scale_factor=(width / orig_w, height / orig_h))))
    data = dict(
        inputs=[
            torch.from_numpy(np.ascontiguousarray(image[..., ::-1])).permute(
                2, 0, 1) for image in rgb
        ],
        data_samples=samples)
    with torch.no_grad():
        predicted = exported.model.detector.test_step(data)
        actual = exported.model(images, sizes)
    expected = tuple(
        torch.stack([getattr(p.pred_instances, key) for p in predicted])
        for key in ('labels', 'bboxes', 'scores'))
    found = match_detections(actual, expected, sizes)
    print(f'\n{exported.name} deploy vs mmdet predict: {found}')
