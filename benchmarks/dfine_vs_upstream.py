r"""D-FINE port vs upstream D-FINE: numerical equivalence from the same
weights, and speed, side by side in one run (fp32, CPU).

    DFINE_UPSTREAM=/path/to/D-FINE python benchmarks/dfine_vs_upstream.py \
        [--sizes n s] [--repeats 7] [--threads 1]

``DFINE_UPSTREAM`` is a checkout of github.com/Peterande/D-FINE (the
commit of tests/test_projects/test_dfine/data/README.md was measured).
Upstream's model and criterion are built by its own code from its YAML
(``configs/dfine/dfine_hgnetv2_{size}_coco.yml``; imports model
construction does not need are stubbed, see
tests/test_projects/test_dfine/upstream_dfine.py). Every upstream weight
is perturbed from its init (so that the zero-initialised heads predict
something), saved, converted by the D-FINE package's
``convert_dfine_state_dict`` (what tools/convert_dfine_checkpoint.py runs)
and loaded into the port's ``configs/_base_/dfine_hgnetv2_{size}.py``
model.
Each size runs in its own process (upstream's config loader keeps state).

Equivalence (relative: max |port - upstream| / max |upstream|):
  eval    640x640, batch 1: class logits and boxes of the evaluated layer.
          Queries are paired by the encoder token they were selected
          from: tokens whose scores tie (e.g. the zeroed border tokens)
          can come out of top-k in another order, which permutes the
          queries without changing any of them.
  train   2 images of 640x640 with 3 and 5 GT, same seed (same dn noise):
          logits, boxes and edge-distribution logits (corners) of every
          decoder layer, for the matching and the dn queries.
  loss    every loss term, end to end (the port's outputs into the port's
          loss), and on the same outputs and matching (upstream's outputs
          fed to both losses).
Speed (port / upstream, runs alternated, ``--threads`` torch threads,
default 1): the process's CPU time per call (median of the per-repeat
ratios), which a shared machine's other load disturbs far less than the
wall clock, and the ratio of the wall-clock minima:
  inference  640x640, batch 1, eval, no grad;
  train      one step: 2 images of 640x640, forward, loss, backward,
             AdamW step.
"""
import argparse
import importlib
import json
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _common import REPO_ROOT

ENV = 'DFINE_UPSTREAM'
IMAGE = 640
TRAIN_GT = (3, 5)


def _relative(ours: torch.Tensor, theirs: torch.Tensor) -> float:
    scale = theirs.abs().max().clamp(min=1e-12)
    return ((ours - theirs).abs().max() / scale).item()


def _import_port():
    """Upstream's builders (the D-FINE tests' helper), and the RT-DETR and
    D-FINE packages under the names the configs' ``custom_imports`` give
    them (their directories have hyphens)."""
    sys.path.insert(
        0, osp.join(REPO_ROOT, 'tests', 'test_projects', 'test_dfine'))
    import upstream_dfine
    return (upstream_dfine, importlib.import_module('projects.RT-DETR.rtdetr'),
            importlib.import_module('projects.D-FINE.dfine'))


def _perturb(state: dict, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    fixed = ('anchors', 'valid_mask', 'num_points_scale', 'up', 'reg_scale')
    for key, value in state.items():
        if not value.dtype.is_floating_point or key.endswith(fixed):
            continue
        noise = torch.randn(value.shape, generator=gen)
        if key.endswith('running_var'):
            value.copy_(noise.abs() * 0.25 + 0.75)
        elif key.endswith('running_mean'):
            value.copy_(noise * 0.1)
        else:
            value.add_(noise * (0.02 if value.dim() > 1 else 0.05))


def build_pair(root: str, size: str):
    """Upstream's model and criterion, and the port's model with the same
    (perturbed, converted) weights."""
    from mmddp_ext.utils import build_reference_model
    upstream_dfine, rtdetr, port = _import_port()
    upstream = upstream_dfine.load_upstream(root)
    built = upstream_dfine.build_from_yaml(
        upstream,
        osp.join(root, 'configs', 'dfine', f'dfine_hgnetv2_{size}_coco.yml'),
        overrides={'HGNetv2': {
            'pretrained': False
        }})
    theirs, criterion = built['model'], built['criterion']
    _perturb(theirs.state_dict())
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, f'dfine_{size}.pth')
        torch.save({'model': theirs.state_dict()}, path)
        state, _ = rtdetr.select_upstream_weights(
            torch.load(path, weights_only=True))
    config = osp.join(REPO_ROOT, 'projects', 'D-FINE', 'configs', '_base_',
                      f'dfine_hgnetv2_{size}.py')
    ours = build_reference_model(config)
    ours.load_state_dict(
        port.convert_dfine_state_dict(
            state,
            ours.state_dict(),
            port.decoder_num_points(ours),
            log=lambda _: None),
        strict=True)
    return theirs, criterion, ours


def _batch(num_gts, size=IMAGE, seed=0):
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(len(num_gts), 3, size, size, generator=gen)
    targets, samples = [], []
    for count in num_gts:
        wh = torch.rand(count, 2, generator=gen) * 0.4 + 0.05
        centre = torch.rand(count, 2, generator=gen) * (1 - wh) + wh / 2
        labels = torch.randint(0, 80, (count, ), generator=gen)
        targets.append(dict(labels=labels, boxes=torch.cat([centre, wh], 1)))
        sample = DetDataSample(
            metainfo=dict(
                img_shape=(size, size),
                batch_input_shape=(size, size),
                ori_shape=(size, size),
                scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([centre - wh / 2, centre + wh / 2], 1) * size,
            labels=labels)
        samples.append(sample)
    return images, targets, samples


def _selected_tokens_theirs(model, feats):
    decoder = model.decoder
    memory, _ = decoder._get_encoder_input(feats)
    if model.training:
        shapes = [f.shape[-2:] for f in feats]
        _, valid = decoder._generate_anchors([list(s) for s in shapes],
                                             device=memory.device)
    else:
        valid = decoder.valid_mask
    logits = decoder.enc_score_head(
        decoder.enc_output(valid.to(memory.dtype) * memory))
    return logits.max(-1).values.topk(decoder.num_queries, dim=1)[1]


def _selected_tokens_ours(model, feats):
    inputs, _ = model.pre_transformer(feats)
    anchors, valid = model.generate_anchors(inputs['level_shapes'],
                                            inputs['memory'])
    logits = model.bbox_head.cls_branches[model.decoder.num_layers](
        model.enc_output(inputs['memory'] * valid.to(inputs['memory'])))
    return logits.max(-1).values.topk(model.num_queries, dim=1)[1]


def _pairing(ours_tokens, their_tokens):
    """Index into the port's queries that puts them in upstream's order;
    queries whose token the other side did not select are dropped (their
    count is reported)."""
    orders, dropped = [], 0
    for mine, theirs in zip(ours_tokens.tolist(), their_tokens.tolist()):
        where = {token: i for i, token in enumerate(mine)}
        orders.append([where.get(t, -1) for t in theirs])
        dropped += sum(1 for t in theirs if t not in where)
    return torch.tensor(orders), dropped


def _take(x, order, offset=0):
    """Queries ``order`` (bs, n) of x (..., bs, offset + n', c)."""
    index = (order + offset).clamp(min=0)
    batch = torch.arange(order.shape[0])[:, None]
    return x[..., batch, index, :]


def equivalence(theirs, criterion, ours) -> dict:
    results = {}
    theirs.eval(), ours.eval()
    images, _, samples = _batch([0], seed=1)
    with torch.no_grad():
        their_feats = theirs.encoder(theirs.backbone(images))
        out_theirs = theirs.decoder(their_feats)
        feats = ours.extract_feat(images)
        out_ours = ours.forward_transformer(feats, samples)
        order, dropped = _pairing(
            _selected_tokens_ours(ours, feats),
            _selected_tokens_theirs(theirs, their_feats))
    valid = order >= 0
    results['eval_logits'] = _relative(
        _take(out_ours['layers_scores'][-1], order)[valid],
        out_theirs['pred_logits'][valid])
    results['eval_boxes'] = _relative(
        _take(out_ours['layers_boxes'][-1], order)[valid],
        out_theirs['pred_boxes'][valid])
    results['eval_unpaired_queries'] = dropped

    theirs.train(), ours.train()
    images, targets, samples = _batch(TRAIN_GT)
    torch.manual_seed(5)
    out_theirs = theirs(images, targets)
    torch.manual_seed(5)
    feats = ours.extract_feat(images)
    out_ours = ours.forward_transformer(feats, samples)
    num_dn = out_ours['dn_meta']['num_denoising_queries']
    with torch.no_grad():
        order, dropped = _pairing(
            _selected_tokens_ours(ours, feats),
            _selected_tokens_theirs(theirs,
                                    theirs.encoder(theirs.backbone(images))))
    results['train_unpaired_queries'] = dropped
    layers = out_theirs['aux_outputs'] + [out_theirs]
    for field, key in (('logits', 'layers_scores'), ('boxes', 'layers_boxes'),
                       ('corners', 'layers_corners')):
        upstream_key = 'pred_' + field
        results[f'train_{field}'] = max(
            _relative(
                _take(out_ours[key][i], order, num_dn).detach(),
                layer[upstream_key].detach())
            for i, layer in enumerate(layers))
        results[f'train_dn_{field}'] = max(
            _relative(out_ours[key][i][:, :num_dn].detach(),
                      layer[upstream_key].detach())
            for i, layer in enumerate(out_theirs['dn_outputs']))

    # losses: end to end, then upstream's outputs into both losses
    losses_ours = ours.bbox_head.loss(**out_ours, batch_data_samples=samples)
    losses_theirs = criterion(out_theirs, targets)
    results['loss_keys_equal'] = set(losses_ours) == set(losses_theirs)
    results['loss_end_to_end'] = _loss_errors(losses_ours, losses_theirs)
    mapped = _as_head_inputs(out_theirs, theirs)
    losses_same = ours.bbox_head.loss(**mapped, batch_data_samples=samples)
    results['loss_same_outputs'] = _loss_errors(losses_same, losses_theirs)
    return results


def _loss_errors(ours: dict, theirs: dict) -> dict:
    errors = {
        key:
        abs(ours[key].item() - value.item()) / max(abs(value.item()), 1e-12)
        for key, value in theirs.items() if key in ours
    }
    worst = max(errors, key=errors.get)
    return dict(
        worst_key=worst,
        worst=errors[worst],
        total=abs(
            sum(v.item()
                for v in ours.values()) - sum(v.item()
                                              for v in theirs.values())) /
        sum(v.item() for v in theirs.values()))


def _as_head_inputs(out: dict, model) -> dict:
    """Upstream's training outputs in the port's head-input layout."""
    layers = out['aux_outputs'] + [out]

    def stacked(field):
        return torch.stack([
            torch.cat([dn[field], layer[field]], 1)
            for dn, layer in zip(out['dn_outputs'], layers)
        ])

    meta = out['dn_meta']
    return dict(
        layers_scores=stacked('pred_logits'),
        layers_boxes=stacked('pred_boxes'),
        layers_corners=stacked('pred_corners'),
        ref_boxes=torch.cat(
            [out['dn_outputs'][0]['ref_points'], out['ref_points']], 1),
        pre_scores=torch.cat([
            out['dn_pre_outputs']['pred_logits'],
            out['pre_outputs']['pred_logits']
        ], 1),
        pre_boxes=torch.cat([
            out['dn_pre_outputs']['pred_boxes'],
            out['pre_outputs']['pred_boxes']
        ], 1),
        up=model.decoder.up,
        reg_scale=model.decoder.reg_scale,
        enc_outputs_class=out['enc_aux_outputs'][0]['pred_logits'],
        enc_outputs_coord=out['enc_aux_outputs'][0]['pred_boxes'],
        dn_meta=dict(
            num_denoising_queries=meta['dn_num_split'][0],
            num_denoising_groups=meta['dn_num_group'],
            dummy_dn_group=False))


def speed(theirs, criterion, ours, repeats: int) -> dict:
    """Port and upstream side by side, alternating who goes first, on
    batches of :data:`IMAGE` px: inference of one image and one training
    step of :data:`TRAIN_GT` boxes; CPU-time medians, the median and range
    of the per-round ratios, and the wall ratio of the fastest rounds."""
    images1, _, samples1 = _batch([0], seed=2)
    images, targets, samples = _batch(TRAIN_GT, seed=3)
    opt_theirs = torch.optim.AdamW(
        [p for p in theirs.parameters() if p.requires_grad], lr=1e-6)
    opt_ours = torch.optim.AdamW(
        [p for p in ours.parameters() if p.requires_grad], lr=1e-6)

    def infer_theirs():
        theirs.eval()
        with torch.no_grad():
            theirs(images1)

    def infer_ours():
        ours.eval()
        with torch.no_grad():
            ours.predict(images1, samples1)

    def train_theirs():
        theirs.train()
        losses = criterion(theirs(images, targets), targets)
        opt_theirs.zero_grad()
        sum(losses.values()).backward()
        opt_theirs.step()

    def train_ours():
        ours.train()
        losses = ours.loss(images, samples)
        opt_ours.zero_grad()
        sum(losses.values()).backward()
        opt_ours.step()

    results = {}
    for name, pair in (('inference', (infer_ours, infer_theirs)),
                       ('train_step', (train_ours, train_theirs))):
        for run in pair:  # warm-up
            run()
        cpu, wall = ([], []), ([], [])
        for repeat in range(repeats):
            # alternate who goes first
            for side in ((0, 1) if repeat % 2 == 0 else (1, 0)):
                start = time.perf_counter(), time.process_time()
                pair[side]()
                wall[side].append(time.perf_counter() - start[0])
                cpu[side].append(time.process_time() - start[1])
        ratios = [a / b for a, b in zip(*cpu)]
        results[name] = dict(
            port_cpu_s=statistics.median(cpu[0]),
            upstream_cpu_s=statistics.median(cpu[1]),
            cpu_ratio=statistics.median(ratios),
            cpu_ratio_min=min(ratios),
            cpu_ratio_max=max(ratios),
            rounds=repeats,
            threads=torch.get_num_threads(),
            port_wall_s=min(wall[0]),
            upstream_wall_s=min(wall[1]),
            wall_ratio=min(wall[0]) / min(wall[1]))
    return results


def run_size(root: str, size: str, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    theirs, criterion, ours = build_pair(root, size)
    result = dict(size=size, equivalence=equivalence(theirs, criterion, ours))
    result['speed'] = speed(theirs, criterion, ours, repeats)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--sizes', nargs='+', default=['n', 's'])
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--one', help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = os.environ.get(ENV)
    if not root or not osp.isdir(root):
        print(
            f'Set {ENV} to a checkout of github.com/Peterande/D-FINE.',
            file=sys.stderr)
        return 2
    if args.one:
        print('RESULT ' +
              json.dumps(run_size(root, args.one, args.repeats, args.threads)))
        return 0
    for size in args.sizes:
        output = subprocess.run([
            sys.executable, __file__, '--one', size, '--repeats',
            str(args.repeats), '--threads',
            str(args.threads)
        ],
                                capture_output=True,
                                text=True,
                                check=True).stdout
        result = json.loads(output.split('RESULT ', 1)[1])
        _print(result)
    return 0


def _print(result: dict) -> None:
    eq, sp = result['equivalence'], result['speed']
    print(f"D-FINE-{result['size'].upper()} (fp32, CPU)")
    print(f"  eval   logits {eq['eval_logits']:.2e}  boxes "
          f"{eq['eval_boxes']:.2e}  (unpaired queries "
          f"{eq['eval_unpaired_queries']})")
    print(f"  train  logits {eq['train_logits']:.2e}  boxes "
          f"{eq['train_boxes']:.2e}  corners {eq['train_corners']:.2e}  "
          f"(unpaired {eq['train_unpaired_queries']})")
    print(f"  dn     logits {eq['train_dn_logits']:.2e}  boxes "
          f"{eq['train_dn_boxes']:.2e}  corners "
          f"{eq['train_dn_corners']:.2e}")
    print(f"  loss keys equal: {eq['loss_keys_equal']}")
    for name in ('loss_end_to_end', 'loss_same_outputs'):
        loss = eq[name]
        print(f"  {name}: worst {loss['worst']:.2e} ({loss['worst_key']}), "
              f"total {loss['total']:.2e}")
    for name, value in sp.items():
        print(f"  {name}: CPU time port {value['port_cpu_s'] * 1e3:.0f} ms, "
              f"upstream {value['upstream_cpu_s'] * 1e3:.0f} ms, port / "
              f"upstream {value['cpu_ratio']:.3f} (median of per-repeat "
              f"ratios); wall minima {value['port_wall_s'] * 1e3:.0f} / "
              f"{value['upstream_wall_s'] * 1e3:.0f} ms = "
              f"{value['wall_ratio']:.3f}")


if __name__ == '__main__':
    sys.exit(main())
