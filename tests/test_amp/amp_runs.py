"""What the AMP tests run on every rank: each tiny family trained a few
iterations with an ``AmpOptimWrapper`` config (float16, dynamic loss scale,
as upstream's recipes) under ``ExtRunner``, recorded by
:class:`AmpRecordHook`, which also compares the first iteration's losses
under float16 autocast with float32 ones (same weights, same batch)."""
import math
import os.path as osp
from typing import Dict, List, Optional

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from ..helpers import REPO_ROOT

ITERS = 8
# Each run's limit, checked in the ranks (RunsInOneLaunch). Measured quiet:
# 2-10 s after another run in the same ranks, up to 17 s as the first run
# of its ranks (CO-DINO; the runs after a failed one start new ranks).
RUN_LIMIT_S = 90
LR = 5e-4
# RT-DETR-tiny at its config's lr: with 5e-4 or 1e-4 (and RT-DETRv2's
# xavier init of the projections) the loss of its first batch rose over
# the 3 steps after the scale settled (it fluctuates in float32 too).
FAMILY_LR = {'rtdetrv2': 1e-3}
# A classification bias this high makes float16 round the sigmoid of
# every query's logit to exactly 1 (above about 8.3), as a confident
# classifier (a checkpoint that trained long) does for some queries.
CONFIDENT_BIAS = 9.0
# DINO-tiny and CO-DINO-tiny on a half-width ResNet-18 (as RT-DETR-tiny's):
# in float16 the full width made 60-75 % of their step time.
_HALF_WIDTH_RESNET18 = dict(
    model=dict(
        backbone=dict(base_channels=32), neck=dict(
            in_channels=[64, 128, 256])))
# family: (config, image side, config overrides); 'rtdetrv2' is the
# port's RT-DETR(v2) model, which RT-DETRv2's recipes train with AMP. 64 px
# where the query count allows (float16 convolutions run ~30x slower than
# float32 on CPUs without float16 units); D-FINE/DEIM-HGNetv2 select 30
# queries among the tokens of strides 16 and 32, 45 at 96 px.
FAMILIES = {
    'rtdetrv2': ('configs/rtdetr_tiny.py', 64, {}),
    'dfine':
    ('projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py', 96, {}),
    'deim_hgnetv2':
    ('projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py', 96,
     dict(model=dict(data_preprocessor=dict(batch_augments=None)))),
    'deim_rtdetrv2':
    ('projects/DEIM/configs/deim_rtdetrv2_tiny_synthetic.py', 64, {}),
    'codino': ('configs/co_dino_tiny.py', 64, _HALF_WIDTH_RESNET18),
    'dino': ('configs/dino_tiny_ddp_safe.py', 64, _HALF_WIDTH_RESNET18),
}
# float16's unit roundoff: 11 significant bits.
UNIT_ROUNDOFF = 2.0**-11


def amp_config(family: str, data_root: str, work_dir: str):
    """``family``'s tiny config as an AMP recipe on ``data_root``: float16
    autocast with a dynamic loss scale (upstream's ``AmpOptimWrapper``
    settings), constant lr, plain DDP, an unshuffled sampler (rank 1 reads
    only the GT-less odd images), no evaluation or checkpoint."""
    from mmengine.config import Config
    config, side, overrides = FAMILIES[family]
    cfg = Config.fromfile(osp.join(REPO_ROOT, config))
    cfg.merge_from_dict(overrides)
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='Resize', scale=(side, side), keep_ratio=True),
        dict(type='PackDetInputs')
    ]
    cfg.train_dataloader = dict(
        batch_size=2,
        num_workers=0,
        sampler=dict(type='DefaultSampler', shuffle=False),
        # One epoch for the whole run: MMEngine's iteration loop sleeps 2 s
        # at every epoch end. Rank r reads images r, r + 2, ... of 4.
        dataset=dict(
            type='RepeatDataset',
            times=ITERS,
            dataset=dict(
                type='CocoDataset',
                data_root=data_root,
                metainfo=dict(classes=('square', 'disc')),
                ann_file='annotations.json',
                data_prefix=dict(img='images/'),
                filter_cfg=dict(filter_empty_gt=False),
                pipeline=pipeline)))
    for key in ('val_dataloader', 'val_cfg', 'val_evaluator',
                'test_dataloader', 'test_cfg', 'test_evaluator'):
        cfg[key] = None
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS)
    cfg.optim_wrapper = dict(
        type='AmpOptimWrapper',
        loss_scale='dynamic',
        dtype='float16',
        optimizer=dict(
            type='AdamW', lr=FAMILY_LR.get(family, LR), weight_decay=1e-4),
        clip_grad=dict(max_norm=0.1, norm_type=2))
    cfg.param_scheduler = None
    cfg.custom_hooks = []
    cfg.default_hooks.checkpoint = None
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_processor = dict(by_epoch=False)
    cfg.model_wrapper_cfg = dict(
        type='MMDistributedDataParallel', find_unused_parameters=False)
    cfg.randomness = dict(seed=0)
    # The batches these runs were measured on (the first-batch agreement's
    # TOTAL_TOLERANCE and its seen deviations) are the ones MMEngine's
    # worker seeding gives; exact resume's per-sample seeds draw other
    # augmentations, on which the GT-less rank's near-zero first-batch total
    # deviated 7 % (D-FINE, 7.3e-4) and 6 % (DEIM, 7.6e-3) in float16,
    # every denoising term within its rounding bound. Resuming is not what
    # these runs test.
    cfg.mmddp_ext_cfg = dict(cfg.get('mmddp_ext_cfg') or {},
                             exact_resume=False)
    cfg.work_dir = work_dir
    cfg.launcher = 'pytorch'
    return cfg


class Float16Depth(TorchFunctionMode):
    """Counts, for every tensor made inside it, the longest chain of torch
    calls that gave a float16 result on the way to it: the number of
    float16 roundings its value went through."""

    def __init__(self):
        super().__init__()
        self._depth: Dict[int, int] = {}
        self._alive: List[torch.Tensor] = []  # keeps ids unique

    def of(self, tensor: torch.Tensor) -> int:
        return self._depth.get(id(tensor), 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = [
            a for a in tree_flatten((args, kwargs or {}))[0]
            if isinstance(a, torch.Tensor)
        ]
        base = max((self.of(a) for a in inputs), default=0)
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                step = int(tensor.dtype == torch.float16)
                self._depth[id(tensor)] = max(self.of(tensor), base + step)
                self._alive.append(tensor)
        return out


def relative_tolerance(depth: int) -> float:
    """Three standard deviations of the relative error after ``depth``
    float16 roundings, each uniform within the unit roundoff ``u``
    (standard deviation ``u / sqrt(3)``) and independent:
    ``3 * u * sqrt(depth / 3) = u * sqrt(3 * depth)``."""
    return UNIT_ROUNDOFF * math.sqrt(3 * max(depth, 1))


class AmpRecordHook(Hook):
    """Per iteration: the total loss, the loss keys and their finiteness,
    whether ``grad_norm`` was finite (``ExtAmpOptimWrapper`` logs only a
    finite one), the loss scale and the scaler's and NonFiniteSkipHook's
    skip counts. Before the first iteration: the losses of its batch with
    float16 autocast and in float32 from the same weights, and each loss's
    float16 depth (:class:`Float16Depth`).

    Args:
        confident_bias (float, optional): Set the bias of every linear
            layer with one output per class to this before training.
    """

    priority = 'LOW'

    def __init__(self, confident_bias: Optional[float] = None):
        self.confident_bias = confident_bias
        self.records: List[dict] = []
        self.compare: Dict[str, dict] = {}
        self.final_loss = math.nan
        self._first_batch = None
        self._norm_count = 0

    def before_train(self, runner) -> None:
        if self.confident_bias is None:
            return
        model = _bare(runner.model)
        num_classes = len(runner.train_dataloader.dataset.metainfo['classes'])
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, torch.nn.Linear) and (module.out_features
                                                            == num_classes):
                    module.bias.fill_(self.confident_bias)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if runner.iter == 0:
            self._first_batch = data_batch
            self.compare = _float16_against_float32(
                _bare(runner.model), data_batch)

    def after_train(self, runner) -> None:
        """The first batch's float16 loss again, with the trained weights
        and the same random draws: the loss falls without the noise of
        different batches and dn draws."""
        self.final_loss = _seeded_loss(
            _bare(runner.model), self._first_batch, torch.float16)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        hub = runner.message_hub
        norms = hub.log_scalars.get('train/grad_norm')
        count = 0 if norms is None else len(norms.data[0])
        wrapper = runner.optim_wrapper
        values = {k: float(v) for k, v in outputs.items()}
        self.records.append(
            dict(
                loss=values['loss'],
                loss_keys=sorted(k for k in values if 'loss' in k),
                all_finite=all(map(math.isfinite, values.values())),
                grad_norm_finite=count > self._norm_count,
                scale=float(wrapper.loss_scaler.get_scale()),
                scaler_skips=wrapper.scaler_skipped_steps,
                nonfinite_skips=int(
                    hub.get_scalar('train/nonfinite_skips').current()),
                num_gt=sum(
                    len(s.gt_instances) for s in data_batch['data_samples'])))
        self._norm_count = count


def _float16_against_float32(model, data_batch) -> Dict[str, dict]:
    """Per loss key: its value in float32 and with float16 autocast, and
    its float16 depth; same weights, batch and random draws (dn noise);
    the model's buffers (BN statistics) are put back afterwards."""
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    values = {}
    depth = Float16Depth()
    device = next(model.parameters()).device.type
    for dtype in (torch.float32, torch.float16):
        with torch.random.fork_rng(), torch.no_grad(), torch.autocast(
                device, dtype=torch.float16, enabled=dtype == torch.float16):
            torch.manual_seed(0)
            if dtype == torch.float16:
                with depth:
                    losses = _losses(model, data_batch)
                    depths = {k: depth.of(v) for k, v in losses.items()}
                    total, _ = model.parse_losses(losses)
                    depths['loss'] = depth.of(total)
            else:
                losses = _losses(model, data_batch)
                total, _ = model.parse_losses(losses)
            values[dtype] = {k: _value(v) for k, v in losses.items()}
            values[dtype]['loss'] = float(total)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])
    return {
        key:
        dict(
            float32=values[torch.float32][key],
            float16=values[torch.float16][key],
            depth=depths.get(key, 0))
        for key in values[torch.float32]
    }


def _bare(model):
    return model.module if is_model_wrapper(model) else model


def _seeded_loss(model, data_batch, dtype: torch.dtype) -> float:
    """The total loss of ``data_batch`` with autocast to ``dtype``, under
    the random draws of seed 0 (the generator's state is put back)."""
    device = next(model.parameters()).device.type
    with torch.random.fork_rng(), torch.no_grad(), torch.autocast(
            device, dtype=dtype):
        torch.manual_seed(0)
        total, _ = model.parse_losses(_losses(model, data_batch))
    return float(total)


def _losses(model, data_batch) -> dict:
    data = model.data_preprocessor(data_batch, True)
    return model(**data, mode='loss')


def _value(loss) -> float:
    if isinstance(loss, (list, tuple)):
        return float(sum(float(v) for v in loss))
    return float(loss)


def train_run(data_root: str, work_root: str, name: str, family: str,
              iters: int) -> dict:
    """On every rank: run ``name``, ``family`` built and trained by
    ExtRunner for ``iters`` iterations (``RunsInOneLaunch`` runs them in
    turn, each under ``RUN_LIMIT_S``).

    Args:
        data_root (str): The generated data (rank 1 reads only the GT-less
            images).
        work_root (str): The run's work dir is ``work_root/name``.
        name (str): The run; one ending in ``_confident`` starts from a
            confident classifier (``CONFIDENT_BIAS``).
        family (str): A key of ``FAMILIES``.
        iters (int): Training iterations.

    Returns:
        dict: The run's records, first-iteration comparison, final loss
        of the first batch, optimizer wrapper type and autocast dtype.
    """
    from mmengine.registry import RUNNERS

    import mmddp_ext  # noqa: F401
    cfg = amp_config(family, data_root, osp.join(work_root, name))
    cfg.train_cfg.max_iters = iters
    runner = RUNNERS.build(cfg)
    confident = name.endswith('_confident')
    hook = AmpRecordHook(CONFIDENT_BIAS if confident else None)
    runner.register_hook(hook)
    runner.train()
    wrapper = runner.optim_wrapper
    return dict(
        records=hook.records,
        compare=hook.compare,
        final_loss=hook.final_loss,
        wrapper=type(wrapper).__name__,
        cast_dtype=str(getattr(wrapper, 'cast_dtype', None)))


def train_without_matching_upcast(data_root: str, work_root: str, name: str,
                                  family: str, iters: int) -> dict:
    """The negative control, on every rank: the heads match the
    predictions in the autocast dtype (``_matching_inputs`` switched back
    to passing them through), then ``train_run``."""
    from mmddp_ext.models.dense_heads import DDPSafeDINOHead
    DDPSafeDINOHead._matching_inputs = (lambda self, cls_score, bbox_pred:
                                        (cls_score, bbox_pred))
    return train_run(data_root, work_root, name, family, iters)
