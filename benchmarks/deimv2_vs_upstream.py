r"""DEIMv2 port vs upstream DEIMv2: numerical equivalence from the same
weights (float64 and float32), and speed side by side (CPU).

    python benchmarks/deimv2_vs_upstream.py [UPSTREAM] \
        [--sizes hgnetv2_n dinov3_s dinov3_l] \
        [--speed-sizes hgnetv2_n dinov3_s] [--rounds 5] [--threads 1]

``UPSTREAM`` (or the environment variable ``DEIMV2_UPSTREAM``) is a
checkout of github.com/Intellindust-AI-Lab/DEIMv2 (commit ``0fff8d4`` was
measured); it is only read. A size is the part of upstream's config name
between ``deimv2_`` and ``_coco.yml`` (``hgnetv2_n``, ``dinov3_s``, ...).
Upstream's model and criterion are built by its own code from its YAML
(tests/test_projects/test_deimv2/upstream_deimv2.py; no pretrained file is
read). The port is built from
``projects/DEIMv2/configs/deimv2_{size}_coco.py``. Each size and part
runs in its own process (upstream's config loader keeps state between
builds).

Weights: every trainable upstream parameter is perturbed from its init
(N(0, 0.02) added to matrices and kernels, N(0, 0.05) to vectors, so that
the zero-initialised heads predict something); DINOv3's ``bias_mask``
(NaN until a file is loaded) is set to the values DINOv3's files hold;
then every BatchNorm's running statistics are those of a calibration batch
(two 640-px images, upstream in train mode with ``momentum=None``), so
that the activations have the size a trained model's have. Upstream's
state dict is saved, converted by the DEIMv2 package's
``convert_deimv2_state_dict`` (what tools/convert_deimv2_checkpoint.py
runs) and loaded into the port with ``strict=True``.

Equivalence (relative error: max |a - ref| / max |ref| over the paired
queries). Float64 is the models' ``.double()`` with the default dtype
left at float32, with upstream's ``eval_spatial_size`` unset so that its
anchors and encoder position embeddings are computed in each forward as
the port's are (with it set, upstream computes them once at construction,
in float32). Where each side makes tensors of the default dtype, both do
so alike: the anchors (upstream: the default dtype; the port: RT-DETR's
``generate_anchors``, float32) and the padded GT boxes of the denoising
groups (both: the default dtype); the GT corners lie on a 5-px grid, so
that the boxes are exact in either dtype and both sides denoise the same
boxes. RMSNorm computes in float32 on both sides (``x.float()``).

  eval     one 640-px image, eval mode: class logits and boxes of the
           evaluated decoder layer. Queries are paired by the encoder token
           they were selected from (tokens whose scores tie can leave top-k
           in another order); queries without a partner are counted.
  layers   two 640-px images with 5 and 0 GT (a GT-less image), backbone,
           encoder and every BatchNorm in eval mode, the decoder in train
           mode, same seed (same denoising noise): logits, boxes and
           edge-distribution logits (corners) of every decoder layer, for
           the matching queries and (float64) the denoising queries.
  loss     float64, every loss key: on the same outputs and so the same
           matching (upstream's outputs of ``layers`` into upstream's
           criterion and into the port's head), and end to end (the port's
           outputs into the port's head); printed per term, the worst over
           its keys. Upstream's criterion runs in float64 only with help
           (:class:`FloatCastIsFloat64`, default dtype float64 around it).
           Both sides divide the L1 and GIoU sums by ``num_boxes`` (the
           port did so through mmdet's ``avg_factor``, which adds float32's
           epsilon: 1.2-2.0e-8 apart in float64 until 2026-11-28).
  float32  the port's float32 error and upstream's own float32 error, both
           against upstream in float64 on the same input (the target: the
           port's within twice upstream's). CPU float32 kernels are not
           bitwise reproducible from run to run here, so these errors move
           by tens of percent between runs. The denoising queries are not
           compared (their noise is drawn in each run's dtype).

RoPE: upstream's rotary embeddings compute the token coordinates in their
``dtype`` attribute: float32 for DINOv3's ViTs (``dinov3_vits16``,
``dinov3_vits16plus``: DEIMv2-L, -X), the default dtype for the distilled
ViT-Tiny / Tiny+ (DEIMv2-S, -M), so that a float64 model's RoPE is
float32 either way here; the port computes it in the model's dtype. The
float64 figures are upstream with that instance attribute set to float64
(no upstream file is changed); upstream as it ships (float32 RoPE) is
printed beside them. The float32 comparisons use the former as the
reference.

Speed (port / upstream, ``--threads`` torch threads, default 1), upstream
built as its YAML says (``eval_spatial_size`` 640): ``--rounds``
interleaved rounds (the order alternates every round) after one warm-up
call each; printed: each side's median CPU time of the process per call
(which other load on a shared machine disturbs far less than the wall
clock), the median and the range of the per-round CPU-time ratios, and the
ratio of the wall-clock medians:

  inference   one 640-px image, eval, no grad (the port's ``predict``,
              its post-processing included; upstream's model forward, its
              post-processor needs torchvision);
  train_step  two 640-px images with 3 and 5 GT: forward, loss, backward,
              AdamW step (upstream: its model and criterion).
"""
import argparse
import copy
import importlib
import json
import os
import os.path as osp
import subprocess
import sys
import tempfile

import dfine_vs_upstream as dfine
import torch
from _common import REPO_ROOT
from torch import nn
from torch.overrides import TorchFunctionMode

from mmddp_ext.utils import build_reference_model
from mmddp_ext.utils.torch_private import BatchNormBase

ENV = 'DEIMV2_UPSTREAM'
CHECKOUT = 'github.com/Intellindust-AI-Lab/DEIMv2'
IMAGE = 640
LAYERS_GT = (5, 0)
SPEED_GT = (3, 5)
CALIBRATION_GT = (4, 6)
DEFAULT_SIZES = ('hgnetv2_n', 'dinov3_s', 'dinov3_l')
DEFAULT_SPEED_SIZES = ('hgnetv2_n', 'dinov3_s')


def upstream_root(given=None) -> str:
    """The upstream checkout: ``given`` or ``$DEIMV2_UPSTREAM``.

    Raises:
        ValueError: neither is set, or the path is not a DEIMv2 checkout.
    """
    root = given or os.environ.get(ENV)
    if not root:
        raise ValueError(
            f'No upstream checkout: pass its path as the first argument or '
            f'set {ENV} to a checkout of {CHECKOUT}.')
    if not osp.isdir(osp.join(root, 'engine', 'deim')):
        raise ValueError(
            f'{root!r} is not a DEIMv2 checkout (no engine/deim in it): '
            f'pass the root of a checkout of {CHECKOUT}.')
    return root


def config_paths(root: str, size: str):
    """Upstream's YAML and the port's config of ``size``.

    Raises:
        ValueError: one of them does not exist.
    """
    yml = osp.join(root, 'configs', 'deimv2', f'deimv2_{size}_coco.yml')
    port = osp.join(REPO_ROOT, 'projects', 'DEIMv2', 'configs',
                    f'deimv2_{size}_coco.py')
    for path in (yml, port):
        if not osp.isfile(path):
            known = sorted(name[len('deimv2_'):-len('_coco.yml')]
                           for name in os.listdir(osp.dirname(yml))
                           if name.endswith('_coco.yml'))
            raise ValueError(f'size {size!r}: {path} does not exist; sizes '
                             f'are {", ".join(known)}.')
    return yml, port


def _import_helpers():
    """Upstream's builders (the DEIMv2 tests' helper), and the RT-DETR and
    DEIMv2 packages under the names the configs' ``custom_imports`` give
    them."""
    sys.path.insert(
        0, osp.join(REPO_ROOT, 'tests', 'test_projects', 'test_deimv2'))
    import upstream_deimv2
    return (upstream_deimv2,
            importlib.import_module('projects.RT-DETR.rtdetr'),
            importlib.import_module('projects.DEIMv2.deimv2'))


def _batch(num_gts, seed):
    """``dfine._batch`` at :data:`IMAGE` px (float32)."""
    return dfine._batch(num_gts, IMAGE, seed)


def _exact_batch(num_gts, seed):
    """:func:`_batch` with the GT corners moved to a 5-px grid: then the
    normalised corners (multiples of 1/128), centres and sizes are exact
    in float32 and float64, and upstream's targets (normalised cx, cy, w,
    h) and the port's samples (pixel corners) hold the same boxes in
    either dtype. (Both denoising generators pad the GT boxes in the
    default dtype, float32 here, and the port normalises the pixel
    corners there: with other boxes the two sides' denoising inputs would
    differ by float32 rounding.)"""
    images, targets, samples = _batch(num_gts, seed)
    for target, sample in zip(targets, samples):
        corners = (sample.gt_instances.bboxes / 5).round() * 5
        corners[:, 2:] = torch.maximum(corners[:, 2:], corners[:, :2] + 5)
        sample.gt_instances.bboxes = corners
        normed = corners.double() / IMAGE
        target['boxes'] = torch.cat([
            (normed[:, :2] + normed[:, 2:]) / 2, normed[:, 2:] - normed[:, :2]
        ], 1).float()
    return images, targets, samples


def _float64(targets, samples):
    """Float64 copies of upstream's targets and the port's samples."""
    targets = [{
        key: value.double() if value.is_floating_point() else value
        for key, value in target.items()
    } for target in targets]
    samples = copy.deepcopy(samples)
    for sample in samples:
        sample.gt_instances.bboxes = sample.gt_instances.bboxes.double()
    return targets, samples


def _perturb(model: nn.Module, seed: int = 1) -> None:
    """Trainable parameters perturbed from their init; DINOv3's
    ``bias_mask`` set as its files hold it (1 on q and v, 0 on k)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in model.named_parameters():
            if not param.requires_grad:
                continue  # up, reg_scale: fixed
            noise = torch.randn(param.shape, generator=gen)
            param.add_(noise * (0.02 if param.dim() > 1 else 0.05))
        for name, buffer in model.named_buffers():
            if name.endswith('bias_mask'):
                third = buffer.numel() // 3
                buffer.fill_(1)
                buffer[third:2 * third] = 0


def _calibrate(model: nn.Module) -> None:
    """BatchNorm running statistics of one calibration batch (train mode,
    ``momentum=None``: the cumulative average over one batch is its
    statistics); the momentum is restored afterwards."""
    norms = [m for m in model.modules() if isinstance(m, BatchNormBase)]
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    images, targets, _ = _batch(CALIBRATION_GT, seed=11)
    model.train()
    with torch.no_grad():
        model(images, targets)
    for norm, momentum in zip(norms, momenta):
        norm.momentum = momentum
    model.eval()


def build_pair(root: str, size: str, cached_eval: bool):
    """Upstream's model and criterion, and the port's model with the same
    (perturbed, calibrated, converted) weights, both in float32.

    Args:
        cached_eval (bool): Keep upstream's ``eval_spatial_size`` (its
            anchors and position embeddings computed once, in float32).
    """
    upstream_deimv2, rtdetr, port = _import_helpers()
    yml, port_config = config_paths(root, size)
    overrides = {
        'HGNetv2': {
            'pretrained': False
        },
        'DINOv3STAs': {
            'weights_path': None
        }
    }
    if not cached_eval:
        overrides['eval_spatial_size'] = None
    built = upstream_deimv2.build_from_yaml(
        upstream_deimv2.load_upstream(root), yml, overrides=overrides)
    theirs, criterion = built['model'], built['criterion']
    torch.manual_seed(0)
    _perturb(theirs)
    _calibrate(theirs)
    with tempfile.TemporaryDirectory() as tmp:
        path = osp.join(tmp, f'deimv2_{size}.pth')
        torch.save({'model': theirs.state_dict()}, path)
        state, _ = rtdetr.select_upstream_weights(
            torch.load(path, weights_only=True))
    ours = build_reference_model(port_config)
    ours.load_state_dict(
        port.convert_deimv2_state_dict(state, ours, log=lambda _: None),
        strict=True)
    return theirs, criterion, ours.eval()


# ------------------------------------------------------------ equivalence
class FloatCastIsFloat64(TorchFunctionMode):
    """``Tensor.float()`` casts to float64 while active. Upstream's
    criterion casts with ``.float()`` (the FGL bin indices in
    ``dfine_utils.translate_gt``, whose float32 weights then refuse the
    float64 values written into them; the FGL IoU weights) and makes
    float tensors of integer ones in the default dtype (DDF's ``num_pos``
    / ``num_neg``), so that a float64 loss cannot run, or is rounded to
    float32, as shipped. Upstream's criterion runs inside this mode and
    with float64 as the default dtype; the port's loss keeps float64 by
    itself (``mmddp_ext.utils.full_precision``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.float:
            return args[0].to(torch.float64)
        return func(*args, **(kwargs or {}))


def _tokens_theirs(model, feats):
    """Encoder tokens upstream's query selection takes (DEIMv2 scores the
    masked memory itself: no ``enc_output``)."""
    decoder = model.decoder
    memory, shapes = decoder._get_encoder_input(feats)
    _, valid = decoder._generate_anchors(shapes, device=memory.device)
    logits = decoder.enc_score_head(valid.to(memory.dtype) * memory)
    return logits.max(-1).values.topk(decoder.num_queries, dim=1)[1]


def _layers_mode(model, parts) -> None:
    """Train mode for the decoder only: ``parts`` (backbone, encoder) and
    every BatchNorm in eval mode."""
    model.train()
    for part in parts:
        part.eval()
    for module in model.modules():
        if isinstance(module, BatchNormBase):
            module.eval()


def run_theirs(model, images, targets=None):
    """Upstream's outputs: eval mode without ``targets``, decoder train
    mode with them. Returns (outputs, tokens); outputs maps a field to its
    per-layer tensors (and ``dn_*`` to the denoising ones)."""
    if targets is None:
        model.eval()
    else:
        _layers_mode(model, (model.backbone, model.encoder))
        torch.manual_seed(5)
    with torch.no_grad():
        feats = model.encoder(model.backbone(images))
        out = model.decoder(feats, targets)
        tokens = _tokens_theirs(model, feats)
    if targets is None:
        return dict(
            logits=[out['pred_logits']],
            boxes=[out['pred_boxes']]), tokens, out
    layers = out['aux_outputs'] + [out]
    result = {}
    for field in ('logits', 'boxes', 'corners'):
        result[field] = [layer['pred_' + field] for layer in layers]
        result['dn_' + field] = [
            layer['pred_' + field] for layer in out['dn_outputs']
        ]
    return result, tokens, out


def run_ours(model, images, samples, train: bool):
    """The port's outputs, as :func:`run_theirs`."""
    if train:
        _layers_mode(model, (model.backbone, model.neck))
        torch.manual_seed(5)
    else:
        model.eval()
    with torch.no_grad():
        feats = model.extract_feat(images)
        out = model.forward_transformer(feats, samples)
        tokens = dfine._selected_tokens_ours(model, feats)
    if not train:
        return dict(
            logits=[out['layers_scores'][-1]],
            boxes=[out['layers_boxes'][-1]]), tokens, out
    num_dn = out['dn_meta']['num_denoising_queries']
    result = {}
    for field, key in (('logits', 'layers_scores'), ('boxes', 'layers_boxes'),
                       ('corners', 'layers_corners')):
        result[field] = [layer[:, num_dn:] for layer in out[key]]
        result['dn_' + field] = [layer[:, :num_dn] for layer in out[key]]
    return result, tokens, out


def errors(side, reference, denoising: bool = True) -> dict:
    """Per field, the largest relative error over the layers of ``side``
    (outputs, tokens) against ``reference``, the matching queries paired
    by token (the denoising queries are in the same order on both sides);
    ``unpaired``: queries of the reference without a partner."""
    (out, tokens), (ref, ref_tokens) = side, reference
    order, dropped = dfine._pairing(tokens, ref_tokens)
    valid = order >= 0
    result = dict(unpaired=dropped)
    for field, ref_layers in ref.items():
        if field not in out or (field.startswith('dn_') and not denoising):
            continue
        if len(out[field]) != len(ref_layers):
            raise RuntimeError(f'{field}: {len(out[field])} layers against '
                               f'{len(ref_layers)}')
        worst = 0.0
        for mine, theirs in zip(out[field], ref_layers):
            if not field.startswith('dn_'):
                mine, theirs = dfine._take(mine, order)[valid], theirs[valid]
            worst = max(worst, dfine._relative(mine.double(), theirs.double()))
        result[field] = worst
    return result


def _loss_keys(ours: dict, theirs: dict) -> dict:
    per_key = {
        key:
        abs(ours[key].item() - value.item()) / max(abs(value.item()), 1e-12)
        for key, value in theirs.items() if key in ours
    }
    worst = max(per_key, key=per_key.get)
    return dict(
        keys_equal=set(ours) == set(theirs),
        only_port=sorted(set(ours) - set(theirs)),
        only_upstream=sorted(set(theirs) - set(ours)),
        count=len(per_key),
        per_key=per_key,
        worst_key=worst,
        worst=per_key[worst])


def _rope_modules(model):
    """Upstream's RoPE modules (DINOv3's and the distilled ViTs')."""
    return [
        m for m in model.modules()
        if type(m).__name__ == 'RopePositionEmbedding'
    ]


def equivalence(theirs, criterion, ours) -> dict:
    """The figures of the module doc's equivalence part."""
    images1, _, samples1 = _batch([0], seed=1)
    images, targets, samples = _exact_batch(LAYERS_GT, seed=3)
    targets64, samples64 = _float64(targets, samples)
    result = dict(rope_modules=len(_rope_modules(theirs)))

    # float64: upstream with its RoPE in float64 (and as shipped), port
    theirs64, ours64 = copy.deepcopy(theirs).double(), copy.deepcopy(
        ours).double()
    eval_ours64 = run_ours(ours64, images1.double(), samples1, False)
    layers_ours64 = run_ours(ours64, images.double(), samples64, True)
    if result['rope_modules']:
        result['float64_eval_upstream_rope32'] = errors(
            eval_ours64[:2],
            run_theirs(theirs64, images1.double())[:2])
        result['float64_layers_upstream_rope32'] = errors(
            layers_ours64[:2],
            run_theirs(theirs64, images.double(), targets64)[:2])
        for module in _rope_modules(theirs64):
            module.dtype = torch.float64
    ref64 = dict(
        eval=run_theirs(theirs64, images1.double()),
        layers=run_theirs(theirs64, images.double(), targets64))
    result['float64_eval'] = errors(eval_ours64[:2], ref64['eval'][:2])
    result['float64_layers'] = errors(layers_ours64[:2], ref64['layers'][:2])

    # losses on the same outputs (so the same matching), end to end
    out_theirs = ref64['layers'][2]
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with FloatCastIsFloat64():
            losses_theirs = criterion(out_theirs, targets64)
    finally:
        torch.set_default_dtype(default)
    mapped = dfine._as_head_inputs(out_theirs, theirs64)
    losses_same = ours64.bbox_head.loss(**mapped, batch_data_samples=samples64)
    result['loss_same_outputs'] = _loss_keys(losses_same, losses_theirs)
    losses_ours = ours64.bbox_head.loss(
        **layers_ours64[2], batch_data_samples=samples64)
    result['loss_end_to_end'] = _loss_keys(losses_ours, losses_theirs)
    del theirs64, ours64

    # float32: the port's and upstream's error against upstream in float64
    for name, side_args in (('eval', ((images1, ), (images1, samples1,
                                                    False))),
                            ('layers', ((images, targets), (images, samples,
                                                            True)))):
        up32 = run_theirs(theirs, *side_args[0])[:2]
        port32 = run_ours(ours, *side_args[1])[:2]
        ref = ref64[name][:2]
        # the denoising noise is drawn in each run's dtype: not compared
        result[f'float32_{name}_port'] = errors(port32, ref, False)
        result[f'float32_{name}_upstream'] = errors(up32, ref, False)
    return result


# ------------------------------------------------------------------ speed
# D-FINE's benchmark times the same pair of calls (predict / loss + AdamW
# step) on the same batches (640 px; one image; 3 and 5 boxes).
assert (dfine.IMAGE, dfine.TRAIN_GT) == (IMAGE, SPEED_GT)
speed = dfine.speed


def run_one(root: str, size: str, part: str, rounds: int,
            threads: int) -> dict:
    torch.set_num_threads(threads)
    theirs, criterion, ours = build_pair(
        root, size, cached_eval=part == 'speed')
    if part == 'speed':
        return dict(size=size, speed=speed(theirs, criterion, ours, rounds))
    return dict(size=size, equivalence=equivalence(theirs, criterion, ours))


# ------------------------------------------------------------------ report
def _fmt_errors(errs: dict, fields) -> str:
    return '  '.join(f'{f} {errs[f]:.1e}' for f in fields if f in errs)


def print_equivalence(result: dict) -> None:
    eq, name = result['equivalence'], f"DEIMv2-{result['size']}"
    print(f'{name} equivalence (CPU, {IMAGE} px)')
    fields = ('logits', 'boxes', 'corners')
    dn = ('dn_logits', 'dn_boxes', 'dn_corners')
    print(f"  float64 eval    {_fmt_errors(eq['float64_eval'], fields)}  "
          f"(unpaired {eq['float64_eval']['unpaired']})")
    print(f"  float64 layers  {_fmt_errors(eq['float64_layers'], fields)}  "
          f"(unpaired {eq['float64_layers']['unpaired']})")
    print(f"  float64 dn      {_fmt_errors(eq['float64_layers'], dn)}")
    if 'float64_eval_upstream_rope32' in eq:
        print(f"  float64, upstream's float32 RoPE as shipped "
              f"({eq['rope_modules']} module): eval "
              f"{_fmt_errors(eq['float64_eval_upstream_rope32'], fields)}; "
              f"layers "
              f"{_fmt_errors(eq['float64_layers_upstream_rope32'], fields)}")
    for key in ('loss_same_outputs', 'loss_end_to_end'):
        loss = eq[key]
        families = {}
        for name, value in loss['per_key'].items():
            family = '_'.join(name.split('_')[:2])
            families[family] = max(families.get(family, 0.0), value)
        print(f"  {key:17s} {loss['count']} keys, equal key sets "
              f"{loss['keys_equal']}, worst per term: " +
              '  '.join(f'{f} {v:.1e}' for f, v in sorted(families.items())) +
              (f", only port {loss['only_port']}, only upstream "
               f"{loss['only_upstream']}" if not loss['keys_equal'] else ''))
    for part in ('eval', 'layers'):
        port, up = eq[f'float32_{part}_port'], eq[f'float32_{part}_upstream']
        ratios = '  '.join(f'{f} {port[f]:.1e} / {up[f]:.1e} = '
                           f'{port[f] / max(up[f], 1e-300):.2f}'
                           for f in fields if f in up)
        print(f'  float32 {part:6s}  port / upstream error vs upstream '
              f'float64: {ratios}  (unpaired {port["unpaired"]} / '
              f'{up["unpaired"]})')


def print_speed(result: dict) -> None:
    threads = next(iter(result['speed'].values()))['threads']
    print(f"DEIMv2-{result['size']} speed (CPU, {IMAGE} px, torch threads "
          f"{threads})")
    for name, value in result['speed'].items():
        print(f"  {name}: CPU time port {value['port_cpu_s'] * 1e3:.0f} ms, "
              f"upstream {value['upstream_cpu_s'] * 1e3:.0f} ms, port / "
              f"upstream {value['cpu_ratio']:.3f} (median of "
              f"{value['rounds']} per-round ratios, range "
              f"{value['cpu_ratio_min']:.3f}-{value['cpu_ratio_max']:.3f}); "
              f"wall, fastest rounds {value['wall_ratio']:.3f}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'upstream', nargs='?', help=f'DEIMv2 checkout (default ${ENV})')
    parser.add_argument('--sizes', nargs='*', default=list(DEFAULT_SIZES))
    parser.add_argument(
        '--speed-sizes', nargs='*', default=list(DEFAULT_SPEED_SIZES))
    parser.add_argument('--rounds', type=int, default=5)
    parser.add_argument('--threads', type=int, default=1)
    parser.add_argument('--one', nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds < 3:
        parser.error(f'--rounds must be at least 3, got {args.rounds}')
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        root = upstream_root(args.upstream)
        for size in set(args.sizes) | set(args.speed_sizes):
            config_paths(root, size)
    except ValueError as error:
        print(f'deimv2_vs_upstream: {error}', file=sys.stderr)
        return 2
    if args.one:
        size, part = args.one
        print('RESULT ' +
              json.dumps(run_one(root, size, part, args.rounds, args.threads)))
        return 0
    torch.set_num_threads(args.threads)
    jobs = [(s, 'equivalence')
            for s in args.sizes] + [(s, 'speed') for s in args.speed_sizes]
    for size, part in jobs:
        # the thread count from the process's start, not only torch's
        # set_num_threads: started with 2 OpenMP threads, float64 runs of N
        # differed from run to run (up to 1.5e-8 in 3 of 7 runs), started
        # with one they did not (3 of 3 runs equal to 1e-15)
        threads = str(args.threads)
        proc = subprocess.run([
            sys.executable, __file__, root, '--one', size, part, '--rounds',
            str(args.rounds), '--threads', threads
        ],
                              capture_output=True,
                              text=True,
                              env=dict(
                                  os.environ,
                                  OMP_NUM_THREADS=threads,
                                  MKL_NUM_THREADS=threads))
        if proc.returncode != 0:
            print(
                f'DEIMv2-{size} {part} failed:\n{proc.stderr[-4000:]}',
                file=sys.stderr)
            return 1
        result = json.loads(proc.stdout.split('RESULT ', 1)[1])
        (print_speed if part == 'speed' else print_equivalence)(result)
        sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main())
