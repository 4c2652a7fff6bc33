"""RT-DETR-r18vd inference and training-step time with the static-tensor
cache switched off (before) and on (after), measured side by side.

    python benchmarks/rtdetr_static_cache_time.py [--repeats 5] [--size 640]

Builds projects/RT-DETR/configs/rtdetr_r18vd_6x_coco.py's model (random
weights, no multi-scale), batch 2 at 640x640 px on the CPU, and
alternates, repeat by repeat:
  before  the encoder position embedding, the decoder anchors and the
          level shapes rebuilt on every forward
          (``StaticTensorCache.enabled = False`` on the neck and detector)
  after   built once per feature size and device (the default)
Each repeat times one inference (``mode='predict'``, no grad) and one
training step (``mode='loss'``, backward) per variant, back to back.
Prints the minimum and median times, the before / after ratio of the
minima (the least disturbed runs on a shared machine) and the median of
the per-repeat ratios. It also times the work the cache removes, the
uncached building of the position embedding, anchors and level shapes of
one forward (minimum of many), which bounds the saving from above. The
regression branches run once per decoder layer in both variants (that
change has no switch), so the ratios isolate the cache.
"""
import argparse
import importlib
import os.path as osp
import time

import torch
from _common import REPO_ROOT, median  # noqa

CONFIG = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                  'rtdetr_r18vd_6x_coco.py')


def build_model():
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    importlib.import_module('projects.RT-DETR.rtdetr')
    init_default_scope('mmdet')
    cfg = Config.fromfile(CONFIG).model
    cfg.backbone.init_cfg = None
    cfg.data_preprocessor.batch_augments = None
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    return model


def make_batch(size: int, batch: int = 2) -> dict:
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(batch):
        inputs.append(
            torch.randint(0, 256, (3, size, size), generator=gen,
                          dtype=torch.uint8))
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(size, size),
                ori_shape=(size, size),
                scale_factor=(1., 1.)))
        xy = torch.rand(5, 2, generator=gen) * size / 2
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([xy, xy + size / 4], 1),
            labels=torch.randint(0, 80, (5, ), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def set_cache(model, enabled: bool) -> None:
    model.static_cache.enabled = enabled
    model.neck.pos_embed_cache.enabled = enabled


def time_inference(model, batch) -> float:
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        data = model.data_preprocessor(batch, False)
        model(**data, mode='predict')
    return time.perf_counter() - start


def time_train_step(model, batch) -> float:
    model.train()
    start = time.perf_counter()
    data = model.data_preprocessor(batch, True)
    losses = model(**data, mode='loss')
    sum(v for k, v in losses.items() if 'loss' in k).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def time_static_builds(model, batch, repeats: int = 50) -> float:
    """Minimum time of building one forward's static tensors uncached."""
    layers = importlib.import_module('projects.RT-DETR.rtdetr.rtdetr_layers')
    model.eval()
    with torch.no_grad():
        data = model.data_preprocessor(batch, False)
        feats = model.neck(model.backbone(data['inputs']))
    shapes = tuple(tuple(f.shape[-2:]) for f in feats)
    memory = feats[0].new_zeros(1, 1, 1)
    height, width = feats[-1].shape[-2:]
    best = float('inf')
    for _ in range(repeats):
        start = time.perf_counter()
        layers.sincos_pos_embed_2d(width, height, feats[-1].size(1),
                                   model.neck.pe_temperature)
        model.generate_anchors(shapes, memory)
        spatial = torch.tensor(shapes, dtype=torch.long)
        torch.cat((spatial.new_zeros(1), spatial.prod(1).cumsum(0)[:-1]))
        best = min(best, time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--size', type=int, default=640)
    args = parser.parse_args()
    model = build_model()
    batch = make_batch(args.size)
    for enabled in (False, True):  # warm-up, fills the cache
        set_cache(model, enabled)
        time_inference(model, batch)
        time_train_step(model, batch)
    times = {(v, kind): []
             for v in ('before', 'after') for kind in ('infer', 'train')}
    for repeat in range(args.repeats):
        for variant, enabled in (('before', False), ('after', True)):
            set_cache(model, enabled)
            times[variant, 'infer'].append(time_inference(model, batch))
            times[variant, 'train'].append(time_train_step(model, batch))
        print(f'repeat {repeat}: ' + ', '.join(
            f'{v} {k} {t[-1] * 1e3:.0f} ms' for (v, k), t in times.items()),
              flush=True)
    print(f'\n== RT-DETR-r18vd, batch 2, {args.size} px, CPU, '
          f'{torch.get_num_threads()} threads, median of {args.repeats} ==')
    for kind, label in (('infer', 'inference'), ('train', 'training step')):
        before, after = times['before', kind], times['after', kind]
        paired = median([b / a for b, a in zip(before, after)])
        print(f'{label:13s}: min before {min(before) * 1e3:7.0f} ms, after '
              f'{min(after) * 1e3:7.0f} ms, ratio of minima '
              f'{min(before) / min(after):.3f}; median before '
              f'{median(before) * 1e3:7.0f} ms, after '
              f'{median(after) * 1e3:7.0f} ms, median of paired ratios '
              f'{paired:.3f}')
    static = time_static_builds(model, batch)
    fastest = min(times['after', 'infer'])
    bound = (fastest + static) / fastest
    print(f'uncached static tensors of one forward: {static * 1e3:.2f} ms '
          f'(bound on the inference ratio: {bound:.4f})')


if __name__ == '__main__':
    main()
