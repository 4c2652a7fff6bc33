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
Prints the median times, the ratio of the medians and the median of the
per-repeat before / after ratios (the pairs share the machine's load). The regression branches run once per decoder layer
in both variants (that change has no switch), so the ratio isolates the
cache.
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
        before = median(times['before', kind])
        after = median(times['after', kind])
        paired = median([
            b / a for b, a in zip(times['before', kind], times['after', kind])
        ])
        print(f'{label:13s}: before {before * 1e3:7.0f} ms, after '
              f'{after * 1e3:7.0f} ms, before / after {before / after:.3f} '
              f'(median of paired ratios {paired:.3f})')


if __name__ == '__main__':
    main()
