"""Peak activation memory of one forward+backward, side by side:

  with_cp       mmdet ResNet-50 with with_cp=True, torch's default
                (reentrant) checkpointing, no DDP: the memory to keep
  non_reentrant the same model under CheckpointConflictHook's default
                policy (checkpoint calls run with use_reentrant=False)
  disable       the same model under its 'disable' policy (checkpoint
                calls run the blocks without checkpointing), the classic
                fix of turning with_cp off

    python benchmarks/checkpoint_memory.py [--batch 4] [--size 256]

Peak memory comes from the torch profiler's CPU allocation events (bytes
allocated minus freed, cumulative maximum) on the same model and input;
on a CUDA machine pass --device cuda to use the allocator's peak instead.
"""
import argparse

import torch
from _common import REPO_ROOT  # noqa: F401  (puts the repo on sys.path)
from mmdet.models.backbones import ResNet
from torch.profiler import ProfilerActivity, profile

from mmddp_ext.utils import activation_checkpoint as act_cp


def build(state: dict, device: str) -> torch.nn.Module:
    model = ResNet(depth=50, out_indices=(1, 2, 3), with_cp=True).to(device)
    model.load_state_dict(state)
    return model


def step(model, x):
    loss = sum(out.float().mean() for out in model(x))
    loss.backward()


def peak_cpu_bytes(model, x) -> int:
    with profile(
            activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(model, x)
    events = sorted((e for e in prof.events() if e.cpu_memory_usage),
                    key=lambda e: e.time_range.start)
    current = peak = 0
    for event in events:
        current += event.self_cpu_memory_usage
        peak = max(peak, current)
    return peak


def peak_cuda_bytes(model, x) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    step(model, x)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--batch', type=int, default=4)
    parser.add_argument('--size', type=int, default=256)
    parser.add_argument('--device', default='cpu')
    args = parser.parse_args()
    torch.manual_seed(0)
    state = ResNet(depth=50, out_indices=(1, 2, 3)).state_dict()
    x = torch.randn(args.batch, 3, args.size, args.size, device=args.device)
    measure = peak_cuda_bytes if args.device == 'cuda' else peak_cpu_bytes
    peaks = {}
    for variant in ('with_cp', 'non_reentrant', 'disable'):
        act_cp.set_policy(None if variant == 'with_cp' else variant)
        model = build(state, args.device)
        step(model, x)  # warm-up (allocator caches, lazy init)
        model.zero_grad(set_to_none=True)
        peaks[variant] = measure(model, x)
        print(
            f'{variant:14s} peak {peaks[variant] / 2**20:8.1f} MiB',
            flush=True)
    print(f"\nnon_reentrant / with_cp: "
          f"{peaks['non_reentrant'] / peaks['with_cp']:.3f}   (goal <= 1.05)")
    print(f"disable / with_cp:       {peaks['disable'] / peaks['with_cp']:.3f}"
          '   (what turning checkpointing off costs)')


if __name__ == '__main__':
    main()
