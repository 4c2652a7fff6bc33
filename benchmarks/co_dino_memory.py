"""Peak memory of one CO-DINO Swin-L forward+backward under DDP, side by
side (the mmdetection #11899 seed case at Swin-L size):

  reentrant      Swin-L backbone with_cp=True + encoder checkpointing
                 (with_cp=6), torch's reentrant default, on the stock
                 head with find_unused_parameters=False: no conflict, the
                 memory to keep
  non_reentrant  the same checkpointing, a query head extended with a
                 parameter that never reaches the loss,
                 find_unused_parameters=True; checkpoint calls made
                 non-reentrant, as mmddp_ext's CheckpointConflictHook does
                 by default (checkpoint_conflict='non_reentrant')
  disable        the same, under the hook's 'disable' policy (checkpoint
                 calls run their functions without checkpointing)
  no_cp          backbone and encoder checkpointing off in the config (the
                 classic fix), extended head, find_unused_parameters=True

    python benchmarks/co_dino_memory.py [--size 256] [--device cpu]

Full Swin-L CO-DINO (embed 192, depths 2-2-18-2; 900 queries, 6+6
layers, ATSS and RPN+RoI auxiliary heads), one image of --size pixels
with GT, a one-rank gloo (or nccl) process group. The 900 queries need at
least 900 encoder tokens, so --size is at least 224. Peak memory as in
benchmarks/checkpoint_memory.py: the profiler's CPU allocation events, or
the CUDA allocator's peak with --device cuda (after a warm-up step; the
profiler counts every allocation, so the CPU run needs none).
"""
import argparse
import importlib
import os.path as osp

import torch
import torch.distributed as dist
from _common import REPO_ROOT
from checkpoint_memory import peak_cpu_bytes, peak_cuda_bytes

SWIN_L = osp.join(REPO_ROOT, 'projects', 'CO-DETR', 'configs', 'codino',
                  'co_dino_5scale_swin_l_16xb1_1x_coco.py')
VARIANTS = {
    # name: (checkpointing, extended head + find_unused_parameters,
    #        CheckpointConflictHook policy)
    'reentrant': (True, False, None),
    'non_reentrant': (True, True, 'non_reentrant'),
    'disable': (True, True, 'disable'),
    'no_cp': (False, True, None),
}


def model_cfg(checkpointing: bool, extended: bool):
    from mmengine.config import Config
    cfg = Config.fromfile(SWIN_L).model
    cfg.backbone.init_cfg = None
    cfg.backbone.with_cp = checkpointing
    cfg.query_head.transformer.encoder.with_cp = 6 if checkpointing else 0
    if extended:
        cfg.query_head.type = 'CoDINOHeadWithUnusedParam'
    return cfg


def build(name: str, device: str):
    from mmdet.registry import MODELS
    from mmengine.model import MMDistributedDataParallel

    from mmddp_ext.utils import activation_checkpoint as act_cp
    checkpointing, extended, policy = VARIANTS[name]
    torch.manual_seed(0)
    model = MODELS.build(model_cfg(checkpointing, extended)).to(device)
    model.init_weights()
    # What CheckpointConflictHook sets for the run: every checkpoint call
    # that does not state use_reentrant follows the policy.
    act_cp.set_policy(policy)
    return MMDistributedDataParallel(
        model.train(), find_unused_parameters=extended)


def batch(size: int, device: str):
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(0)
    sample = DetDataSample(
        metainfo=dict(
            img_shape=(size, size),
            ori_shape=(size, size),
            scale_factor=(1.0, 1.0)))
    sample.gt_instances = InstanceData(
        bboxes=torch.tensor([[8., 16., 120., 200.], [90., 40., 250., 150.]]) *
        size / 256,
        labels=torch.tensor([3, 17]))
    inputs = torch.randint(
        0, 256, (3, size, size), generator=gen, dtype=torch.uint8)
    return dict(inputs=[inputs.to(device)], data_samples=[sample])


def loss_fn(ddp, raw_batch):
    """``x -> [total loss]``, the callable checkpoint_memory measures."""

    def total_loss(_):
        data = ddp.module.data_preprocessor(raw_batch, training=True)
        losses = ddp(**data, mode='loss')
        return [ddp.module.parse_losses(losses)[0]]

    return total_loss


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--size', type=int, default=256)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    from mmdet.utils import register_all_modules

    from mmddp_ext.testing import free_port
    from mmddp_ext.utils import activation_checkpoint as act_cp
    register_all_modules()
    importlib.import_module('mmddp_ext')
    importlib.import_module('tests.test_projects.test_codetr.extended_heads')
    dist.init_process_group(
        'nccl' if args.device == 'cuda' else 'gloo',
        init_method=f'tcp://127.0.0.1:{free_port()}',
        rank=0,
        world_size=1)
    measure = peak_cuda_bytes if args.device == 'cuda' else peak_cpu_bytes
    raw = batch(args.size, args.device)
    peaks = {}
    for name in VARIANTS:
        ddp = build(name, args.device)
        step = loss_fn(ddp, raw)
        if args.device == 'cuda':
            measure(step, None)  # warm-up (allocator caches, lazy init)
            ddp.zero_grad(set_to_none=True)
        peaks[name] = measure(step, None)
        print(f'{name:14s} peak {peaks[name] / 2**20:9.1f} MiB', flush=True)
        del ddp, step
    act_cp.set_policy(None)
    dist.destroy_process_group()
    print(f"\nnon_reentrant / reentrant: "
          f"{peaks['non_reentrant'] / peaks['reentrant']:.3f}"
          '   (goal <= 1.05)')
    print(f"non_reentrant / no_cp:     "
          f"{peaks['non_reentrant'] / peaks['no_cp']:.3f}"
          '   (what checkpointing saves)')
    print(f"disable / reentrant:       "
          f"{peaks['disable'] / peaks['reentrant']:.3f}"
          "   (what the 'disable' policy costs)")


if __name__ == '__main__':
    main()
