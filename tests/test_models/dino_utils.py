"""Tiny DINO models and in-memory batches shared by the model tests."""
import os.path as osp
from typing import Dict, Optional, Sequence, Tuple

import torch

REPO_ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
TINY_MODEL_CFG = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                          'dino_tiny.py')
IMAGE_SIZE = 96
NUM_CLASSES = 2
# Noise this small leaves every noisy dn query equal to its GT box bit for
# bit (below half an ulp of any coordinate), so the dn queries no longer
# depend on how many random numbers a batch layout draws.
NO_NOISE = 1e-20


def tiny_dino_cfg(ddp_safe: bool = True,
                  deterministic: bool = False,
                  head: Optional[str] = None):
    """The tiny DINO model config (configs/_base_/models/dino_tiny.py).

    Args:
        ddp_safe (bool): Use DDPSafeDINO + DDPSafeDINOHead instead of
            mmdet's DINO + DINOHead.
        deterministic (bool): Make each image's loss independent of the
            rest of its batch: BN on running statistics and noise-free dn
            queries. Needed to compare DDP with a single process.
        head (str, optional): Override the head type.
    """
    from mmengine.config import Config
    cfg = Config.fromfile(TINY_MODEL_CFG).model
    if ddp_safe:
        cfg.type = 'DDPSafeDINO'
        cfg.bbox_head.type = 'DDPSafeDINOHead'
    if head:
        cfg.bbox_head.type = head
    if deterministic:
        cfg.backbone.norm_eval = True
        cfg.dn_cfg.label_noise_scale = NO_NOISE
        cfg.dn_cfg.box_noise_scale = NO_NOISE
    return cfg


def build_model(cfg, seed: int = 0) -> torch.nn.Module:
    """Build and initialise ``cfg`` from a fixed seed, in train mode, on
    the device of this rank (:func:`mmddp_ext.testing.on_rank_device`:
    moved once, after its last parameter exists)."""
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules

    import mmddp_ext  # noqa: F401  (registers the DDP-safe models)
    from mmddp_ext.testing import on_rank_device
    register_all_modules()
    torch.manual_seed(seed)
    model = MODELS.build(cfg)
    model.init_weights()
    return on_rank_device(model).train()


def _random_boxes(num: int, gen: torch.Generator) -> torch.Tensor:
    """``num`` boxes (x1, y1, x2, y2) of 12..48 px inside the image."""
    wh = torch.randint(12, 49, (num, 2), generator=gen).float()
    xy = torch.rand(num, 2, generator=gen) * (IMAGE_SIZE - wh)
    return torch.cat([xy, xy + wh], dim=1)


def raw_batch(gt_counts: Sequence[int],
              first_index: int = 0,
              seed: int = 0) -> Dict:
    """An unprocessed batch; image ``first_index + i`` has ``gt_counts[i]``
    boxes. Each image depends only on its global index and ``seed``, so
    the batches of several ranks concatenate to the single-process batch.
    """
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData
    inputs, samples = [], []
    for offset, count in enumerate(gt_counts):
        gen = torch.Generator().manual_seed(seed * 100003 + first_index +
                                            offset)
        inputs.append(
            torch.randint(
                0,
                256, (3, IMAGE_SIZE, IMAGE_SIZE),
                generator=gen,
                dtype=torch.uint8))
        sample = DetDataSample(
            metainfo=dict(
                img_id=first_index + offset,
                img_shape=(IMAGE_SIZE, IMAGE_SIZE),
                ori_shape=(IMAGE_SIZE, IMAGE_SIZE),
                scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=_random_boxes(count, gen),
            labels=torch.randint(0, NUM_CLASSES, (count, ), generator=gen))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def loss_and_grads(model: torch.nn.Module,
                   batch: Dict,
                   forward=None) -> Tuple[Dict, Dict]:
    """One forward/backward of ``batch``; returns the loss dict (detached)
    and every parameter's gradient (None where it received none).

    ``forward`` is the callable that computes the loss dict from the
    processed batch (e.g. a DDP wrapper); defaults to ``model``.
    """
    model.zero_grad(set_to_none=True)
    data = model.data_preprocessor(batch, training=True)
    losses = (forward or model)(**data, mode='loss')
    total, _ = model.parse_losses(losses)
    total.backward()
    grads = {
        name: None if p.grad is None else p.grad.detach().clone()
        for name, p in model.named_parameters()
    }
    return losses, grads


def loss_values(losses: Dict) -> Dict[str, float]:
    """Loss dict as python floats (a list value counts as its sum)."""
    values = {}
    for key, value in losses.items():
        if isinstance(value, (list, tuple)):
            value = sum(v.sum() for v in value)
        values[key] = value.detach().sum().item()
    return values


def _host(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().cpu().double()


def relative_errors(grads: Dict, reference: Dict) -> Dict[str, float]:
    """Per parameter ``||g - ref|| / ||ref||`` (0 where both are zero),
    on the host (the ranks' gradients come back there; a reference may
    have been built on the ranks' GPU)."""
    errors = {}
    for name, ref in reference.items():
        diff = (_host(grads[name]) - _host(ref)).norm().item()
        scale = _host(ref).norm().item()
        errors[name] = diff / scale if scale > 0 else diff
    return errors


def global_relative_error(grads: Dict, reference: Dict) -> float:
    """``||g - ref|| / ||ref||`` over all parameters together, on the
    host."""
    squared_diff = sum((_host(grads[k]) - _host(ref)).norm()**2
                       for k, ref in reference.items())
    squared_ref = sum(_host(ref).norm()**2 for ref in reference.values())
    return (squared_diff / squared_ref).sqrt().item()


def counting_all_reduce(calls: list):
    """``(real, counting)``: ``counting`` is a ``dist.all_reduce`` that
    records each call's tensor shape in ``calls`` and then runs ``real``.
    Install it with ``dist.all_reduce = counting`` and restore ``real``."""
    import torch.distributed as dist
    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        calls.append(tuple(tensor.shape))
        return real_all_reduce(tensor, *args, **kwargs)

    return real_all_reduce, all_reduce


def drop_dn_padding_of_gt_less_images(head) -> None:
    """Zero the dn label weights of images without GT, on ``head``.

    mmdet's DINOHead trains the zero-padding dn queries of a GT-less image
    as background (weight 1) when another image of its batch has GT. Under
    DDP, the same image on a GT-less rank has no dn part at all (stock) or
    the zero-weight dummy (ours). That term depends on how images are
    batched, not on DDP, so single-process references drop it.
    """
    upstream_targets = head._get_dn_targets_single

    def targets(gt_instances, img_meta, dn_meta):
        labels, label_weights, *rest = upstream_targets(
            gt_instances, img_meta, dn_meta)
        if len(gt_instances) == 0:
            label_weights = torch.zeros_like(label_weights)
        return (labels, label_weights, *rest)

    head._get_dn_targets_single = targets


def ddp_step_report(model: torch.nn.Module,
                    batch: Dict,
                    passes: int = 2,
                    process_group=None) -> Dict:
    """``passes`` forward/backward passes of ``batch`` through
    ``DistributedDataParallel(model, find_unused_parameters=False)``
    (call it on every rank). Later passes make DDP's reducer check that
    every parameter was reduced in the first. ``process_group`` is DDP's
    (default: the default group).

    Returns:
        dict: of the first pass, ``loss_keys``, ``loss_values``, the shape
        of every ``dist.all_reduce`` (``all_reduce_calls``),
        ``missing_grads`` (parameters without a gradient),
        ``grad_checksum`` and ``grads``.
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    ddp = DistributedDataParallel(
        model, find_unused_parameters=False, process_group=process_group)
    calls = []
    real_all_reduce, dist.all_reduce = counting_all_reduce(calls)
    try:
        losses, grads = loss_and_grads(model, batch, forward=ddp)
        first_pass_calls = list(calls)
        for _ in range(passes - 1):
            loss_and_grads(model, batch, forward=ddp)
    finally:
        dist.all_reduce = real_all_reduce
    return dict(
        loss_keys=list(losses),
        loss_values=loss_values(losses),
        all_reduce_calls=first_pass_calls,
        missing_grads=[name for name, g in grads.items() if g is None],
        grad_checksum=sum(g.double().sum().item() for g in grads.values()),
        grads=grads)


def record_dn_meta(head: torch.nn.Module) -> list:
    """Make ``head.loss`` (a DINO-style head) append each call's
    ``dn_meta`` and loss keys to the returned list, as a dict with those
    two keys."""
    calls = []
    head_loss = head.loss

    def loss(*args, **kwargs):
        dn_meta = kwargs.get('dn_meta', args[-1] if args else None)
        losses = head_loss(*args, **kwargs)
        calls.append(
            dict(
                dn_meta=None if dn_meta is None else dict(dn_meta),
                loss_keys=sorted(losses)))
        return losses

    head.loss = loss
    return calls


class StockDnGenerator:
    """Generator mixin: mmdet's ``CdnQueryGenerator.__call__``, so a
    GT-less batch gets zero dn queries and no dummy group."""

    def __call__(self, batch_data_samples):
        from mmdet.models.layers import CdnQueryGenerator
        return CdnQueryGenerator.__call__(self, batch_data_samples)


class V1StyleDnGenerator:
    """Generator mixin: what official RT-DETR v1 gives a GT-less batch, no
    dn part at all (``dn_meta`` None, no attention mask); batches with GT
    are unchanged."""

    def __call__(self, batch_data_samples):
        if sum(len(s.gt_instances) for s in batch_data_samples):
            return super().__call__(batch_data_samples)
        weight = self.label_embedding.weight
        batch_size = len(batch_data_samples)
        return (weight.new_zeros(batch_size, 0, self.embed_dims),
                weight.new_zeros(batch_size, 0, 4), None, None)


class V1StyleCriterion:
    """Head mixin: like official RT-DETR v1's criterion, no dn loss terms
    when the outputs have no dn part (``dn_meta`` None). mmdet 3.3's
    ``DINOHead.split_outputs`` reads ``dn_meta`` before checking it for
    None, so a v1-style port needs this too."""

    @staticmethod
    def split_outputs(all_layers_cls_scores, all_layers_bbox_preds,
                      dn_meta):
        if dn_meta is None:
            return all_layers_cls_scores, all_layers_bbox_preds, None, None
        from mmdet.models.dense_heads import DINOHead
        return DINOHead.split_outputs(all_layers_cls_scores,
                                      all_layers_bbox_preds, dn_meta)


def swap_behaviour(obj, mixin) -> None:
    """Give ``obj`` the methods of ``mixin`` first (same state, same
    parameters): how a negative control switches one mechanism off."""
    obj.__class__ = type(f'{mixin.__name__}{type(obj).__name__}',
                         (mixin, type(obj)), {})


def control_step_report(model: torch.nn.Module, batch: Dict,
                        timeout_s: float) -> Dict:
    """``ddp_step_report`` for a negative control that is expected to
    break DDP (run it last on the ranks). The loss's ``dist.all_reduce``
    calls and DDP's gradient buckets each run on a new process group whose
    collectives time out after ``timeout_s``: a rank that skips some of
    them leaves its peers waiting, and they fail within that bound. Kept
    apart, the two streams never pair a scalar all-reduce with a gradient
    bucket, which gloo would answer by aborting the process. Returns
    ``error`` (None if the step passed), the loss keys of each forward
    that completed and, when it passed, the report."""
    import datetime

    import torch.distributed as dist
    timeout = datetime.timedelta(seconds=timeout_s)
    loss_group = dist.new_group(backend='gloo', timeout=timeout)
    ddp_group = dist.new_group(backend='gloo', timeout=timeout)
    real_all_reduce = dist.all_reduce

    def all_reduce_on_group(tensor, op=dist.ReduceOp.SUM, group=None,
                            async_op=False):
        return real_all_reduce(
            tensor, op=op, group=loss_group, async_op=async_op)

    loss_keys = []
    parse_losses = model.parse_losses

    def recording_parse_losses(losses):
        loss_keys.append(sorted(losses))
        return parse_losses(losses)

    model.parse_losses = recording_parse_losses
    dist.all_reduce = all_reduce_on_group
    try:
        report = ddp_step_report(model, batch, process_group=ddp_group)
        report.pop('grads')
        return dict(error=None, report=report, loss_keys=loss_keys)
    except Exception as failure:  # the expected failure, reported
        return dict(
            error=f'{type(failure).__name__}: {failure}',
            loss_keys=loss_keys)
    finally:
        dist.all_reduce = real_all_reduce


def record_generator_calls(generator) -> list:
    """Make ``generator`` (a dn query generator) append each call's
    ``dn_meta`` (None when it gave no dn part) to the returned list."""
    calls = []

    class Recording:

        def __call__(self, batch_data_samples):
            outputs = super().__call__(batch_data_samples)
            dn_meta = outputs[-1]
            calls.append(None if dn_meta is None else dict(dn_meta))
            return outputs

    swap_behaviour(generator, Recording)
    return calls


def check_port_gives_the_gt_less_rank_a_dummy_group(dn_run, empty_rank):
    """Every rank of a ``*_dn_control`` run: the GT-less rank got the dummy
    group and all ranks have the same loss keys, all-reduces, gradients."""
    for rank, result in enumerate(dn_run):
        for dn_meta in result['port_dn']:
            assert dn_meta['dummy_dn_group'] is (rank == empty_rank)
            if rank == empty_rank:
                assert dn_meta['num_denoising_queries'] == 2
        port = result['port']
        assert port['loss_keys'] == dn_run[0]['port']['loss_keys']
        assert port['all_reduce_calls'] == dn_run[0]['port'][
            'all_reduce_calls']
        assert port['missing_grads'] == []


def check_v1_style_gt_less_rank_breaks_ddp(dn_run, empty_rank):
    """The negative control of a ``*_dn_control`` run: without the dn part
    the GT-less rank has no dn loss keys, issues
    fewer all-reduces and leaves the dn label embedding unused."""
    assert dn_run[empty_rank]['v1_dn'][0] is None
    # The rank with GT may fail inside its forward (its extra dn
    # all-reduces), before its loss keys are recorded.
    empty = dn_run[empty_rank]['v1']['loss_keys'][0]
    assert not any('dn_loss' in key for key in empty)
    assert any('dn_loss' in key for key in dn_run[0]['port']['loss_keys'])
    # The seed failure: the GT-less rank left the dn label embedding out
    # of its graph, so DDP stops it at the next step, while the rank with
    # GT waits for all-reduces that never come (a hang, bounded here by
    # the control groups' timeout).
    assert 'Expected to have finished reduction' in (
        dn_run[empty_rank]['v1']['error'] or '')
    assert 'Timed out waiting' in (dn_run[0]['v1']['error'] or '')
