"""Training-step time of CO-DINO vs stock mmdet DINO of the same size,
measured side by side in one process.

    python benchmarks/co_dino_step_time.py [--steps 12] [--repeats 3]

One forward + backward + parameter update (AdamW) per step on a fixed
batch of two 96-px images (one with GT, one without), CPU, one thread.
Variants, all with ResNet-18, 3 feature levels, 1 encoder + 2 decoder
layers, 30 queries, 256-d (mmdet's DINO decoder only supports 256-d):
  dino          stock mmdet DINO (configs/_base_/models/dino_tiny.py)
  codino_noaux  the CO-DINO port with its auxiliary heads removed (query
                head only: DDP-safe DINO + CO-DINO's transformer)
  codino        the CO-DINO port with ATSS and RPN + RoI auxiliary heads
                and their positive query groups
  codino_tiny   configs/co_dino_tiny.py as the tests and demo run it
                (128-d transformer)
  dino_swin, codino_swin
                dino and codino with a Swin-L-tiny backbone in place of
                ResNet-18: mmdet's SwinTransformer as the Swin-L configs
                build it (window 12, heads doubling per stage, drop path,
                checkpointing off) at embed 48 and 2 blocks per stage
Prints the median step time of each and the ratios; variants alternate
so machine noise hits all of them alike.
"""
import argparse
import copy
import os.path as osp
import time

from _common import REPO_ROOT, median  # noqa: F401

WIDEN_KEYS = ('embed_dims', 'out_channels', 'in_channels', 'feat_channels')


def _widen(node, old=128, new=256):
    """CO-DINO-tiny's 128-d layers at ``new`` dims (FFN/fc sizes kept)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in WIDEN_KEYS and value == old:
                node[key] = new
            elif key == 'num_feats' and value == old // 2:
                node[key] = new // 2
            else:
                _widen(value, old, new)
    elif isinstance(node, list):
        for item in node:
            _widen(item, old, new)
    return node


def _variants():
    from mmengine.config import Config
    tiny = Config.fromfile(osp.join(REPO_ROOT, 'configs',
                                    'co_dino_tiny.py')).model
    wide = _widen(copy.deepcopy(tiny))
    noaux = copy.deepcopy(wide)
    noaux.update(
        rpn_head=None,
        roi_head=[],
        bbox_head=[],
        train_cfg=[wide['train_cfg'][0]],
        test_cfg=[wide['test_cfg'][0]])
    noaux['query_head']['transformer']['num_co_heads'] = 0
    dino = Config.fromfile(
        osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                 'dino_tiny.py')).model
    return dict(
        dino=dino,
        codino_noaux=noaux,
        codino=wide,
        codino_tiny=tiny,
        dino_swin=_with_swin_l_tiny(dino),
        codino_swin=_with_swin_l_tiny(wide))


def _with_swin_l_tiny(cfg):
    """``cfg`` with a Swin-L-shaped backbone at tiny size."""
    swin = copy.deepcopy(cfg)
    swin['backbone'] = dict(
        type='SwinTransformer',
        embed_dims=48,
        depths=[2, 2, 2, 2],
        num_heads=[3, 6, 12, 24],
        window_size=12,
        drop_path_rate=0.3,
        out_indices=(1, 2, 3),
        with_cp=False)
    swin['neck']['in_channels'] = [96, 192, 384]
    return swin


def _build(cfg):
    import importlib

    import torch
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    import mmddp_ext  # noqa: F401
    register_all_modules()
    importlib.import_module('projects.CO-DETR.codetr')
    torch.manual_seed(0)
    model = MODELS.build(cfg)
    model.init_weights()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model.train(), optimizer


def _step(model, optimizer, batch):
    data = model.data_preprocessor(batch, training=True)
    losses = model(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    optimizer.zero_grad()
    total.backward()
    optimizer.step()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=12)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument('--warmup', type=int, default=3)
    args = parser.parse_args()

    import torch
    torch.set_num_threads(1)
    from tests.test_models.dino_utils import raw_batch
    batch = raw_batch([2, 0])
    models = {name: _build(cfg) for name, cfg in _variants().items()}
    times = {name: [] for name in models}
    for name, (model, optimizer) in models.items():
        for _ in range(args.warmup):
            _step(model, optimizer, batch)
    for _ in range(args.repeats):
        for name, (model, optimizer) in models.items():
            for _ in range(args.steps):
                start = time.perf_counter()
                _step(model, optimizer, batch)
                times[name].append(time.perf_counter() - start)
    step = {name: median(values) for name, values in times.items()}
    for name, value in step.items():
        params = sum(p.numel() for p in models[name][0].parameters())
        print(f'{name:13s} median step {value * 1000:7.1f} ms '
              f'({params / 1e6:.1f} M parameters)')
    print(f"codino / dino        : {step['codino'] / step['dino']:.2f}x")
    print(f"codino_noaux / dino  : {step['codino_noaux'] / step['dino']:.2f}x")
    print(f"aux heads cost       : "
          f"{step['codino'] / step['codino_noaux'] - 1:+.0%} "
          '(codino / codino_noaux - 1)')
    print(f"codino_tiny / dino   : {step['codino_tiny'] / step['dino']:.2f}x")
    print(f"codino_swin / dino_swin: "
          f"{step['codino_swin'] / step['dino_swin']:.2f}x (Swin-L-tiny)")


if __name__ == '__main__':
    main()
