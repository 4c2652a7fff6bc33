r"""Write ``upstream_recipes.json``: the training recipe of every official
D-FINE and DEIM config, as upstream's own code reads and runs it.

    git clone https://github.com/Peterande/D-FINE /tmp/upstream/D-FINE
    git -C /tmp/upstream/D-FINE checkout \
        4a1f73a8bcfac736a88abde9596d87f116d780a7
    git clone https://github.com/ShihuaHuang95/DEIM /tmp/upstream/DEIM
    git -C /tmp/upstream/DEIM checkout \
        a9aa4adce6b5e97b2a6ca9452bf01b7c35440913
    python tests/test_projects/test_deim/data/make_upstream_recipes.py \
        --dfine /tmp/upstream/D-FINE --deim /tmp/upstream/DEIM

Each config is read in a fresh process (upstream's ``load_config`` keeps
the merged includes in a default argument, so a second config in one
process would inherit the first one's keys). For each config the file
records, with the repository, commit and YAML file:

- ``yaml``: the values of the merged YAML (upstream's ``load_config`` with
  its ``__include__`` files) that make the recipe: optimizer (type, lr,
  betas, weight decay, the regex ``params`` groups), ``clip_max_norm``,
  epochs, the lr schedule keys (``lr_scheduler``,
  ``lr_warmup_scheduler``, DEIM's ``lrsheduler``, ``lr_gamma``,
  ``warmup_iter``, ``flat_epoch``, ``no_aug_epoch``), ``ema``,
  ``use_ema``, ``use_amp``, ``sync_bn``, ``find_unused_parameters``, the
  train transforms (``ops``, ``policy``, ``mosaic_prob``), the collate
  function's keys (``stop_epoch``, ``ema_restart_decay``, ``base_size``,
  ``base_size_repeat``, ``mixup_prob``, ``mixup_epochs``), batch sizes,
  ``num_classes`` and ``remap_mscoco_category``;
- ``param_groups``: the lr, weight decay and betas of each group of the
  optimizer that upstream's ``YAMLConfig.optimizer`` builds
  (``get_optim_params`` on upstream's own model, ``create``-d from the
  YAML with ``pretrained: False``), in the optimizer's order, with its
  trainable parameters as indices into ``parameters[param_names]`` (the
  sorted upstream names, stored once per distinct list, their shapes in
  ``parameter_shapes``);
- ``collate``: upstream's ``BatchImageCollateFunction`` built from the
  YAML as its ``DataLoader`` builds it: the multi-scale ``scales`` (null:
  one size), ``stop_epoch``, ``ema_restart_decay``, ``mixup_prob`` and
  ``mixup_epochs``, or the ``error`` building it raises;
- ``lr_trace``: the lr each parameter group trains with, at sampled
  iterations, when upstream's schedulers are driven the way its
  ``det_solver.py`` / ``det_engine.py`` drive them (D-FINE: the
  ``LinearWarmup`` stepped after every iteration and the ``MultiStepLR``
  after every epoch once the warm-up is over; DEIM: the ``LinearWarmup``
  built (its constructor sets the first iteration's lr) and the
  ``FlatCosineLRScheduler`` stepped after every iteration with the index
  of the iteration just done), for ``LR_TRACE_ITERS_PER_EPOCH`` iterations
  per epoch;
- ``policy_table``: which of the train transforms upstream's ``Compose``
  (``policy``) runs, epoch by epoch: the distinct op sequences of
  ``POLICY_DRAWS`` samples per epoch (recording stand-ins for the ops,
  named as upstream's transform classes), merged over runs of epochs with
  the same sequences, and the share of samples with Mosaic.

and, once per repository:

- ``ema_trace``: upstream's ``ModelEMA`` (``decay``, ``warmups`` of each
  config family) updated from a toy module whose weights and buffers
  follow ``EMA_TOY`` (the decay of the first updates and the averaged
  state after them);
- ``mixup_example`` (DEIM): upstream's ``BatchImageCollateFunction`` with
  ``mixup_prob`` 1 run on ``MIXUP_INPUTS`` after ``random.seed``: the
  mixed images and targets;
- ``mosaic_example`` (DEIM): upstream's ``Mosaic`` on ``MOSAIC_INPUTS``:
  the indices and affine parameters it draws, its image and boxes;
- ``mal_example`` (DEIM): upstream's ``DEIMCriterion.loss_labels_mal`` on
  ``MAL_INPUTS`` (seeded logits, given matching) for each ``gamma`` and
  ``mal_alpha``.

Only what these steps never run is stubbed: ``src.misc.dist_utils`` /
``engine.misc.dist_utils`` (one process: ``de_parallel`` is the identity)
and ``torch.utils.tensorboard`` when missing. The package ``__init__``
files are skipped (they import datasets, evaluators and loggers); the
modules needed are imported one by one. torchvision must be importable
(the transforms and collate modules import it at module level); a CUDA
wheel on a CPU-only machine is used without its C++ ops (its fake-kernel
registrations are skipped; nothing here calls those ops).
"""
import argparse
import importlib
import importlib.util
import json
import os.path as osp
import random
import subprocess
import sys
import types
from typing import Dict, List, Optional

HERE = osp.dirname(osp.abspath(__file__))
OUTPUT = osp.join(HERE, 'upstream_recipes.json')
REPOSITORIES = {
    'D-FINE': 'https://github.com/Peterande/D-FINE',
    'DEIM': 'https://github.com/ShihuaHuang95/DEIM',
}
SIZES = ('n', 's', 'm', 'l', 'x')
#: (repository, YAML under the checkout) of every config recorded
CONFIGS = ([('D-FINE', f'configs/dfine/dfine_hgnetv2_{s}_coco.yml')
            for s in SIZES] +
           [('D-FINE', f'configs/dfine/custom/dfine_hgnetv2_{s}_custom.yml')
            for s in SIZES] +
           [('DEIM', f'configs/deim_dfine/deim_hgnetv2_{s}_coco.yml')
            for s in SIZES] +
           [('DEIM', f'configs/deim_rtdetrv2/deim_{name}_coco.yml')
            for name in ('r18vd_120e', 'r34vd_120e', 'r50vd_m_60e',
                         'r50vd_60e', 'r101vd_60e')])
#: Package name and the modules imported from it, per repository.
TREES = {
    'D-FINE':
    dict(
        package='src',
        modules=('core.workspace', 'core.yaml_utils', 'core.yaml_config',
                 'optim.optim', 'optim.warmup', 'optim.ema',
                 'nn.backbone.hgnetv2', 'zoo.dfine.hybrid_encoder',
                 'zoo.dfine.dfine_decoder', 'zoo.dfine.dfine',
                 'data.dataloader', 'data.transforms.container')),
    'DEIM':
    dict(
        package='engine',
        modules=('core.workspace', 'core.yaml_utils', 'core.yaml_config',
                 'optim.optim', 'optim.warmup', 'optim.ema',
                 'optim.lr_scheduler', 'backbone.hgnetv2', 'backbone.presnet',
                 'deim.hybrid_encoder', 'deim.dfine_decoder',
                 'deim.rtdetrv2_decoder', 'deim.deim', 'data.dataloader',
                 'data.transforms.container', 'data.transforms.mosaic',
                 'deim.deim_criterion')),
}
PRETRAINED_OFF = {
    'HGNetv2': {
        'pretrained': False
    },
    'PResNet': {
        'pretrained': False
    }
}
LR_TRACE_ITERS_PER_EPOCH = 50
POLICY_DRAWS = 400
POLICY_SEED = 0
#: Names upstream's Compose matches its ``policy`` ops against.
POLICY_OP_NAMES = ('Mosaic', 'RandomPhotometricDistort', 'RandomZoomOut',
                   'RandomIoUCrop')
#: A toy module's weights follow ``base + step * slope`` at every update.
EMA_TOY = dict(
    updates=[1, 2, 3, 10, 100, 1000, 2000, 5000],
    steps=3,
    base=0.5,
    slope=0.25)
#: Four images (height, width) whose shorter side is already the mosaic's
#: ``output_size`` (so the resizes are exact copies in PIL and in cv2),
#: with xyxy boxes, the seeds and the mosaic settings.
MOSAIC_INPUTS = dict(
    seed=5,
    output_size=6,
    rotation_range=10,
    translation_range=[0.1, 0.1],
    scaling_range=[0.5, 1.5],
    sizes=[[6, 9], [8, 6], [6, 6], [7, 6]],
    boxes=[[[1.0, 1.0, 5.0, 4.0]], [[0.0, 2.0, 3.0, 7.5]], [],
           [[2.0, 1.0, 6.0, 6.0], [0.5, 0.5, 1.5, 2.0]]])
#: Logits (2 images x 4 queries x 3 classes, drawn from a seed), predicted
#: and GT boxes (normalised cx, cy, w, h) and the matching (query, GT) per
#: image, for DEIM's MAL.
MAL_INPUTS = dict(
    seed=7,
    num_classes=3,
    num_boxes=3.0,
    gammas=[1.5, 2.0],
    mal_alphas=[None, 0.5],
    pred_boxes=[[[0.3, 0.3, 0.2, 0.2], [0.5, 0.5, 0.4, 0.3],
                 [0.7, 0.2, 0.1, 0.2], [0.2, 0.8, 0.3, 0.3]],
                [[0.5, 0.5, 0.5, 0.5], [0.1, 0.1, 0.1, 0.1],
                 [0.6, 0.6, 0.2, 0.3], [0.4, 0.3, 0.2, 0.2]]],
    targets=[
        dict(
            boxes=[[0.32, 0.28, 0.2, 0.25], [0.5, 0.52, 0.35, 0.3]],
            labels=[2, 0]),
        dict(boxes=[[0.6, 0.62, 0.25, 0.3]], labels=[1]),
    ],
    indices=[[[0, 1], [0, 1]], [[2], [0]]])
MIXUP_INPUTS = dict(
    seed=3,
    epoch=5,
    mixup_epochs=[4, 29],
    images=[[[[0.0, 0.25], [0.5, 1.0]]], [[[1.0, 0.5], [0.25, 0.0]]],
            [[[0.2, 0.4], [0.6, 0.8]]]],
    targets=[
        dict(boxes=[[0.5, 0.5, 0.2, 0.4]], labels=[1], area=[8.0]),
        dict(boxes=[], labels=[], area=[]),
        dict(
            boxes=[[0.3, 0.6, 0.2, 0.2], [0.7, 0.2, 0.4, 0.2]],
            labels=[0, 2],
            area=[4.0, 8.0]),
    ])


def _import_torchvision() -> None:
    """Import torchvision; a CUDA wheel's fake-kernel registrations need
    its C++ ops, which do not load on a CPU-only torch: skip them."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.startswith('torchvision')]:
            del sys.modules[name]
        sys.modules['torchvision._meta_registrations'] = types.ModuleType(
            'torchvision._meta_registrations')
        import torchvision  # noqa: F401,F811


def _dist_utils(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.de_parallel = lambda model: model
    module.is_dist_available_and_initialized = lambda: False
    module.get_world_size = lambda: 1
    module.is_main_process = lambda: True
    return module


def load_tree(repository: str, root: str) -> types.SimpleNamespace:
    """Import one checkout's recipe modules; returns them by short name."""
    tree = TREES[repository]
    package = tree['package']
    _import_torchvision()
    if importlib.util.find_spec('tensorboard') is None:
        sys.modules['torch.utils.tensorboard'] = types.SimpleNamespace(
            SummaryWriter=object)
    sys.path.insert(0, root)
    names = {package}
    for module in tree['modules']:
        parts = module.split('.')
        names.update(f'{package}.' + '.'.join(parts[:depth])
                     for depth in range(1, len(parts)))
    names.add(f'{package}.misc')
    for name in sorted(names):
        stub = types.ModuleType(name)
        stub.__path__ = [osp.join(root, *name.split('.'))]
        sys.modules[name] = stub
    sys.modules[f'{package}.misc'].dist_utils = sys.modules[
        f'{package}.misc.dist_utils'] = _dist_utils(
            f'{package}.misc.dist_utils')
    loaded = {}
    for module in tree['modules']:
        loaded[module] = importlib.import_module(f'{package}.{module}')
        if module == 'core.workspace':
            core = sys.modules[f'{package}.core']
            core.register = loaded[module].register
            core.create = loaded[module].create
            core.GLOBAL_CONFIG = loaded[module].GLOBAL_CONFIG
    sys.path.remove(root)
    return types.SimpleNamespace(**{
        m.split('.')[-1]: v
        for m, v in loaded.items()
    })


def _get(cfg: dict, *keys, default=None):
    for key in keys:
        if not isinstance(cfg, dict) or key not in cfg:
            return default
        cfg = cfg[key]
    return cfg


def yaml_values(cfg: dict) -> dict:
    """The recipe keys of a merged upstream YAML."""
    train = cfg.get('train_dataloader', {})
    transforms = _get(train, 'dataset', 'transforms', default={})
    return dict(
        optimizer=cfg.get('optimizer'),
        clip_max_norm=cfg.get('clip_max_norm'),
        epochs=cfg.get('epochs', cfg.get('epoches')),
        lr_scheduler=cfg.get('lr_scheduler'),
        lr_warmup_scheduler=cfg.get('lr_warmup_scheduler'),
        lrsheduler=cfg.get('lrsheduler'),
        lr_gamma=cfg.get('lr_gamma'),
        warmup_iter=cfg.get('warmup_iter'),
        flat_epoch=cfg.get('flat_epoch'),
        no_aug_epoch=cfg.get('no_aug_epoch'),
        use_ema=cfg.get('use_ema'),
        ema=cfg.get('ema'),
        use_amp=cfg.get('use_amp'),
        sync_bn=cfg.get('sync_bn'),
        find_unused_parameters=cfg.get('find_unused_parameters'),
        ops=transforms.get('ops'),
        policy=transforms.get('policy'),
        mosaic_prob=transforms.get('mosaic_prob'),
        collate_fn=train.get('collate_fn'),
        total_batch_size=train.get('total_batch_size'),
        val_total_batch_size=_get(cfg, 'val_dataloader', 'total_batch_size'),
        num_classes=cfg.get('num_classes'),
        remap_mscoco_category=cfg.get('remap_mscoco_category'),
        checkpoint_freq=cfg.get('checkpoint_freq'),
        criterion=cfg.get(cfg.get('criterion')),
        model_parts={
            part: cfg.get(name)
            for part, name in cfg.get(cfg.get('model'), {}).items()
        })


def param_groups(up: types.SimpleNamespace, yml: str) -> List[dict]:
    """Upstream's optimizer groups for ``yml`` (see the module doc)."""
    cfg = up.yaml_config.YAMLConfig(yml, **PRETRAINED_OFF)
    optimizer = cfg.optimizer
    names = {id(param): name for name, param in cfg.model.named_parameters()}
    return [
        dict(
            lr=group['lr'],
            weight_decay=group['weight_decay'],
            betas=list(group['betas']),
            params=[names[id(p)] for p in group['params']],
            shapes=[list(p.shape) for p in group['params']])
        for group in optimizer.param_groups
    ]


def _trace_points(total: int, marks: List[int]) -> List[int]:
    points = {0, 1, 2, 3, total - 1}
    for mark in marks:
        points.update(m for m in range(mark - 2, mark + 3) if 0 <= m < total)
    points.update(range(0, total, max(1, total // 40)))
    return sorted(points)


def lr_trace(up: types.SimpleNamespace, repository: str, yml: str) -> dict:
    """The lr of every group, iteration by iteration, as upstream's solver
    drives its schedulers (see the module doc)."""
    import torch
    cfg = up.yaml_config.YAMLConfig(yml, **PRETRAINED_OFF)
    merged = cfg.yaml_cfg
    optimizer = cfg.optimizer
    lr_scheduler = cfg.lr_scheduler
    warmup = cfg.lr_warmup_scheduler
    per_epoch = LR_TRACE_ITERS_PER_EPOCH
    epochs = merged.get('epochs', merged.get('epoches'))
    total = per_epoch * epochs
    flat_cosine = repository == 'DEIM' and merged.get('lrsheduler')
    marks = []
    if flat_cosine:
        flat_cosine = up.lr_scheduler.FlatCosineLRScheduler(
            optimizer,
            merged['lr_gamma'],
            per_epoch,
            total_epochs=epochs,
            warmup_iter=merged['warmup_iter'],
            flat_epochs=merged['flat_epoch'],
            no_aug_epochs=merged['no_aug_epoch'])
        marks = [
            merged['warmup_iter'], per_epoch * merged['flat_epoch'],
            total - per_epoch * merged['no_aug_epoch']
        ]
    else:
        marks = [warmup.warmup_duration]
    points = set(_trace_points(total, marks))
    lrs = []
    with torch.no_grad():
        for epoch in range(epochs):
            for i in range(per_epoch):
                step = epoch * per_epoch + i
                if step in points:
                    lrs.append([g['lr'] for g in optimizer.param_groups])
                # the optimizer steps here; then, as det_engine.py:
                if flat_cosine:
                    flat_cosine.step(step, optimizer)
                else:
                    warmup.step()
            if not flat_cosine and warmup.finished():
                lr_scheduler.step()
    return dict(iters_per_epoch=per_epoch, iters=sorted(points), lrs=lrs)


class _Recorder:
    """Stand-in for a transform: records its (upstream class) name."""
    log: List[str] = []

    def forward(self, *inputs):
        _Recorder.log.append(type(self).__name__)
        return inputs if len(inputs) > 1 else inputs[0]


def policy_table(up: types.SimpleNamespace, cfg: dict) -> Optional[list]:
    """Upstream's ``Compose`` policy, epoch by epoch (see the module doc).

    Returns:
        list[dict] | None: ``epochs`` [first, last], ``sequences`` (sorted
        distinct op-name sequences), ``mosaic_draws`` of ``draws``
        samples; None without a policy.
    """
    import torch.nn as nn
    transforms = _get(cfg, 'train_dataloader', 'dataset', 'transforms')
    if not transforms or not transforms.get('policy'):
        return None
    ops = []
    for op in transforms['ops']:
        cls = type(op['type'], (_Recorder, nn.Module), {})
        ops.append(cls())
    kwargs = {}
    if 'mosaic_prob' in transforms:
        kwargs['mosaic_prob'] = transforms['mosaic_prob']
    compose = up.container.Compose(ops, policy=transforms['policy'], **kwargs)
    epochs = cfg.get('epochs', cfg.get('epoches'))
    random.seed(POLICY_SEED)
    table = []
    for epoch in range(epochs):
        dataset = types.SimpleNamespace(epoch=epoch)
        sequences, mosaics = set(), 0
        for _ in range(POLICY_DRAWS):
            _Recorder.log = []
            compose(None, {}, dataset)
            sequences.add(tuple(_Recorder.log))
            mosaics += 'Mosaic' in _Recorder.log
        sequences = sorted(list(s) for s in sequences)
        if table and table[-1]['sequences'] == sequences:
            table[-1]['epochs'][1] = epoch
            table[-1]['mosaic_draws'] += mosaics
            table[-1]['draws'] += POLICY_DRAWS
            continue
        table.append(
            dict(
                epochs=[epoch, epoch],
                sequences=sequences,
                mosaic_draws=mosaics,
                draws=POLICY_DRAWS))
    return table


class _RecipeCollateProbe:
    """Holds a ``collate_fn`` injected by upstream's ``create``."""
    __inject__ = ['collate_fn']

    def __init__(self, collate_fn=None) -> None:
        self.collate_fn = collate_fn


def build_collate(up: types.SimpleNamespace, cfg: dict) -> dict:
    """Upstream's ``BatchImageCollateFunction`` of ``cfg``, built as
    upstream's ``DataLoader`` builds its ``collate_fn`` (``create`` of an
    ``__inject__``-ed dict), without the dataset: ``scales``,
    ``stop_epoch``, ``ema_restart_decay``, ``mixup_prob`` and
    ``mixup_epochs`` as the object holds them, or ``error``: what building
    it raises."""
    workspace = up.workspace
    name = _RecipeCollateProbe.__name__
    if name not in workspace.GLOBAL_CONFIG:
        workspace.register()(_RecipeCollateProbe)
    global_cfg = up.yaml_utils.merge_config(
        cfg, inplace=False, overwrite=False)
    global_cfg[name]['collate_fn'] = _get(cfg, 'train_dataloader',
                                          'collate_fn')
    try:
        collate = workspace.create(name, global_cfg).collate_fn
    except TypeError as error:
        return dict(error=f'{type(error).__name__}: {error}')
    return {
        key: getattr(collate, key, None)
        for key in ('scales', 'stop_epoch', 'ema_restart_decay', 'mixup_prob',
                    'mixup_epochs')
    }


def ema_trace(up: types.SimpleNamespace, decay: float, warmups: int) -> dict:
    """Upstream's ``ModelEMA`` on the ``EMA_TOY`` module."""
    import torch
    import torch.nn as nn
    toy = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))

    def set_weights(step: int) -> None:
        with torch.no_grad():
            for index, value in enumerate(toy.state_dict().values()):
                if value.dtype.is_floating_point:
                    value.fill_(EMA_TOY['base'] + index +
                                step * EMA_TOY['slope'])

    set_weights(0)
    ema = up.ema.ModelEMA(toy, decay=decay, warmups=warmups)
    states = []
    for step in range(1, EMA_TOY['steps'] + 1):
        set_weights(step)
        ema.update(toy)
        states.append({
            k: v.tolist()
            for k, v in ema.module.state_dict().items()
        })
    return dict(
        decay=decay,
        warmups=warmups,
        decays={u: ema.decay_fn(u)
                for u in EMA_TOY['updates']},
        toy=EMA_TOY,
        states=states,
        updates=ema.updates)


def mixup_example(up: types.SimpleNamespace) -> dict:
    """Upstream's collate MixUp on ``MIXUP_INPUTS`` (see the module doc)."""
    import torch
    collate = up.dataloader.BatchImageCollateFunction(
        mixup_prob=1.0, mixup_epochs=MIXUP_INPUTS['mixup_epochs'])
    collate.set_epoch(MIXUP_INPUTS['epoch'])
    items = []
    for image, target in zip(MIXUP_INPUTS['images'], MIXUP_INPUTS['targets']):
        items.append((torch.tensor(image), {
            'boxes':
            torch.tensor(target['boxes']).reshape(-1, 4),
            'labels':
            torch.tensor(target['labels'], dtype=torch.int64),
            'area':
            torch.tensor(target['area']),
        }))
    random.seed(MIXUP_INPUTS['seed'])
    images, targets = collate(items)
    return dict(
        inputs=MIXUP_INPUTS,
        images=images.tolist(),
        targets=[{
            k: v.tolist()
            for k, v in t.items()
        } for t in targets])


def mosaic_example(up: types.SimpleNamespace) -> dict:
    """Upstream's ``Mosaic`` (``use_cache=False``) on ``MOSAIC_INPUTS``:
    the dataset indices it draws, the ``RandomAffine`` parameters it
    draws, the output image and boxes."""
    import numpy as np
    import torch
    from PIL import Image
    misc = sys.modules[up.mosaic.__name__.rsplit('.', 2)[0] + '._misc']
    rng = np.random.RandomState(MOSAIC_INPUTS['seed'])
    items = []
    for (height, width), boxes in zip(MOSAIC_INPUTS['sizes'],
                                      MOSAIC_INPUTS['boxes']):
        pixels = rng.randint(1, 256, (height, width, 3), dtype=np.uint8)
        target = {
            'boxes':
            misc.convert_to_tv_tensor(
                torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                'boxes',
                spatial_size=(height, width)),
            'labels':
            torch.arange(len(boxes)),
        }
        items.append((pixels, target))

    class Dataset:

        def __len__(self):
            return len(items)

        def load_item(self, index):
            pixels, target = items[index]
            return Image.fromarray(pixels), dict(target)

    mosaic = up.mosaic.Mosaic(
        output_size=MOSAIC_INPUTS['output_size'],
        rotation_range=MOSAIC_INPUTS['rotation_range'],
        translation_range=MOSAIC_INPUTS['translation_range'],
        scaling_range=MOSAIC_INPUTS['scaling_range'],
        probability=1.0,
        fill_value=0,
        use_cache=False)
    affine = mosaic.affine_transform
    draw_name = 'make_params' if hasattr(affine,
                                         'make_params') else '_get_params'
    draw = getattr(affine, draw_name)
    drawn = {}

    def record(*args, **kwargs):
        drawn.update(draw(*args, **kwargs))
        return drawn

    setattr(affine, draw_name, record)
    indices = []
    choices = random.choices

    def record_choices(*args, **kwargs):
        indices.extend(choices(*args, **kwargs))
        return indices[-kwargs['k']:]

    random.seed(MOSAIC_INPUTS['seed'])
    torch.manual_seed(MOSAIC_INPUTS['seed'])
    up.mosaic.random.choices = record_choices
    try:
        first = Image.fromarray(items[0][0])
        image, target, _ = mosaic(first, dict(items[0][1]), Dataset())
    finally:
        up.mosaic.random.choices = choices
    return dict(
        inputs=MOSAIC_INPUTS,
        images=[pixels.tolist() for pixels, _ in items],
        indices=indices,
        affine=dict(
            angle=drawn['angle'],
            translate=list(drawn['translate']),
            scale=drawn['scale'],
            shear=list(drawn['shear'])),
        image=np.asarray(image).tolist(),
        boxes=target['boxes'].tolist(),
        labels=target['labels'].tolist())


def mal_example(up: types.SimpleNamespace) -> dict:
    """Upstream DEIM's ``loss_labels_mal`` on ``MAL_INPUTS``, for each
    ``gamma`` and ``mal_alpha``."""
    import torch
    generator = torch.Generator().manual_seed(MAL_INPUTS['seed'])
    logits = torch.randn(2, 4, MAL_INPUTS['num_classes'], generator=generator)
    outputs = dict(
        pred_logits=logits, pred_boxes=torch.tensor(MAL_INPUTS['pred_boxes']))
    targets = [
        dict(boxes=torch.tensor(t['boxes']), labels=torch.tensor(t['labels']))
        for t in MAL_INPUTS['targets']
    ]
    indices = [(torch.tensor(q), torch.tensor(g))
               for q, g in MAL_INPUTS['indices']]
    losses = []
    for gamma in MAL_INPUTS['gammas']:
        for mal_alpha in MAL_INPUTS['mal_alphas']:
            criterion = up.deim_criterion.DEIMCriterion(
                matcher=None,
                weight_dict={},
                losses=['mal'],
                gamma=gamma,
                num_classes=MAL_INPUTS['num_classes'],
                mal_alpha=mal_alpha)
            loss = criterion.loss_labels_mal(outputs, targets, indices,
                                             MAL_INPUTS['num_boxes'])
            losses.append(
                dict(
                    gamma=gamma,
                    mal_alpha=mal_alpha,
                    loss_mal=loss['loss_mal'].item()))
    return dict(inputs=MAL_INPUTS, logits=logits.tolist(), losses=losses)


def one_config(repository: str, root: str, yml: str) -> dict:
    up = load_tree(repository, root)
    path = osp.join(root, yml)
    cfg = up.yaml_utils.load_config(path)
    record = dict(
        repository=REPOSITORIES[repository],
        file=yml,
        yaml=yaml_values(cfg),
        collate=build_collate(up, cfg),
        policy_table=policy_table(up, cfg),
        param_groups=param_groups(up, path))
    record['lr_trace'] = lr_trace(up, repository, path)
    return record


def per_repository(repository: str, root: str, ema_values: set) -> dict:
    up = load_tree(repository, root)
    record = dict(ema_traces=[
        ema_trace(up, decay, warmups) for decay, warmups in sorted(ema_values)
    ])
    if repository == 'DEIM':
        record['mixup_example'] = mixup_example(up)
        record['mosaic_example'] = mosaic_example(up)
        record['mal_example'] = mal_example(up)
    return record


def _share_parameter_names(data: dict) -> None:
    """Store each distinct list of trainable parameter names (and their
    shapes) once, under ``parameters`` (``parameter_shapes``); a config's
    groups then hold indices into its list (``param_names``: the key of
    that list)."""
    tables: Dict[str, List[str]] = {}
    shapes: Dict[str, List[List[int]]] = {}
    for key, record in data['configs'].items():
        shape_of = {
            name: shape
            for g in record['param_groups']
            for name, shape in zip(g['params'], g.pop('shapes'))
        }
        ordered = sorted(shape_of)
        ordered_shapes = [shape_of[name] for name in ordered]
        table = next((k for k, v in tables.items()
                      if v == ordered and shapes[k] == ordered_shapes), None)
        if table is None:
            table = key
            tables[key] = ordered
            shapes[key] = ordered_shapes
        index = {name: i for i, name in enumerate(tables[table])}
        record['param_names'] = table
        for group in record['param_groups']:
            group['params'] = [index[name] for name in group['params']]
    data['parameters'] = tables
    data['parameter_shapes'] = shapes


def dumps(obj, depth: int = 0) -> str:
    """JSON with one item per line, except lists of numbers and strings,
    which stay on one line."""
    pad, inner = ' ' * depth, ' ' * (depth + 1)
    if isinstance(obj, dict) and obj:
        items = [
            f'{inner}{json.dumps(str(k))}: {dumps(v, depth + 1)}'
            for k, v in obj.items()
        ]
        return '{\n' + ',\n'.join(items) + '\n' + pad + '}'
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [inner + dumps(v, depth + 1) for v in obj]
        return '[\n' + ',\n'.join(items) + '\n' + pad + ']'
    return json.dumps(obj)


def _commit(root: str) -> str:
    out = subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'],
                         capture_output=True,
                         text=True).stdout.strip()
    return out or 'unknown (not a git checkout)'


def _child(args: List[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args],
                         capture_output=True,
                         text=True)
    if out.returncode:
        raise RuntimeError(f'{args} failed:\n{out.stderr[-4000:]}')
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--dfine', help='a Peterande/D-FINE checkout')
    parser.add_argument('--deim', help='a ShihuaHuang95/DEIM checkout')
    parser.add_argument('--output', default=OUTPUT)
    parser.add_argument('--one', nargs=3, help=argparse.SUPPRESS)
    parser.add_argument('--repository', nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_config(*args.one)))
        return 0
    if args.repository:
        name, root, values = args.repository
        print(json.dumps(per_repository(name, root, json.loads(values))))
        return 0
    roots = {'D-FINE': args.dfine, 'DEIM': args.deim}
    if not all(roots.values()):
        parser.error('pass both --dfine and --deim checkouts')
    data = dict(
        source=dict(
            repositories={
                name: dict(url=REPOSITORIES[name], commit=_commit(root))
                for name, root in roots.items()
            },
            command='python tests/test_projects/test_deim/data/'
            'make_upstream_recipes.py --dfine <D-FINE checkout> '
            '--deim <DEIM checkout>',
            code='each repository\'s core/yaml_utils.py load_config, '
            'core/yaml_config.py YAMLConfig (optimizer, lr_scheduler, '
            'lr_warmup_scheduler), optim/ (ema.py ModelEMA, warmup.py, '
            'DEIM lr_scheduler.py), data/dataloader.py '
            'BatchImageCollateFunction and data/transforms/container.py '
            'Compose',
            stubbed='misc.dist_utils (one process) and '
            'torch.utils.tensorboard when missing'),
        configs={},
        repositories={})
    ema_values: Dict[str, set] = {name: set() for name in roots}
    for repository, yml in CONFIGS:
        record = _child(['--one', repository, roots[repository], yml])
        data['configs'][f'{repository}/{yml}'] = record
        ema = record['yaml']['ema']
        ema_values[repository].add((ema['decay'], ema['warmups']))
        groups = ', '.join(f"{len(g['params'])} lr {g['lr']} wd "
                           f"{g['weight_decay']}"
                           for g in record['param_groups'])
        print(f'{repository}/{yml}: {groups}; collate {record["collate"]}')
    for repository, root in roots.items():
        data['repositories'][repository] = _child([
            '--repository', repository, root,
            json.dumps(sorted(ema_values[repository]))
        ])
    _share_parameter_names(data)
    with open(args.output, 'w') as f:
        f.write(dumps(data) + '\n')
    print(f'wrote {args.output}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
