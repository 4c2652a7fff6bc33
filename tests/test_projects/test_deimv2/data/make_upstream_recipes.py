r"""Write ``upstream_recipes.json``: the optimizer parameter groups and the
recipe keys of every DEIMv2 COCO config, as upstream's own code reads them.

    git clone https://github.com/Intellindust-AI-Lab/DEIMv2 /tmp/DEIMv2
    git -C /tmp/DEIMv2 checkout 0fff8d4dcdc272e6cf2d84be31399db471357941
    PYTHONPATH=<torchvision> python \
        tests/test_projects/test_deimv2/data/make_upstream_recipes.py \
        /tmp/DEIMv2

``<torchvision>``: a folder holding a torchvision that matches this
repository's torch (recorded: 0.28.0 with torch 2.13.0, installed with
``pip install --target``; only this scratch run imports it).

Each config is read in a fresh process (upstream's ``load_config`` keeps
the merged includes in a default argument). For each the file records:

- ``yaml``: the recipe values of the merged YAML (``load_config`` with its
  ``__include__`` files): ``epoches``, ``warmup_iter``, ``flat_epoch``,
  ``no_aug_epoch``, ``lr_gamma``, ``lrsheduler``, ``ema``, ``use_ema``,
  ``use_amp``, ``clip_max_norm``, ``sync_bn``, the optimizer, the train
  transforms' ``policy`` and ``mosaic_prob``, the collate function's keys,
  ``total_batch_size``, ``eval_spatial_size``;
- ``criterion``: the options of the ``DEIMCriterion`` and
  ``HungarianMatcher`` upstream's ``create`` builds (defaults and includes
  resolved): ``losses``, ``use_uni_set``, ``weight_dict``, ``gamma``,
  ``alpha``; the matcher's cost weights, focal ``alpha`` / ``gamma``,
  ``change_matcher``, ``iou_order_alpha``, ``matcher_change_epoch``;
- ``param_groups``: the lr, weight decay and betas of each group of the
  optimizer upstream builds (its ``YAMLConfig.get_optim_params`` on its own
  model, ``create``-d from the YAML with ``HGNetv2.pretrained: False`` and
  ``DINOv3STAs.weights_path: None``, then ``torch.optim.AdamW`` with the
  YAML's ``lr``, ``betas`` and ``weight_decay``, as upstream's ``create``
  does), with the names of its trainable parameters.

- ``lr_trace``, ``collate`` and ``policy_table``: as
  ``test_deim/data/make_upstream_recipes.py`` records them for DEIM (its
  ``lr_trace``, ``build_collate`` and ``policy_table``, imported from it
  and run on this checkout's modules, loaded by its ``load_tree``): the lr
  of every group at sampled iterations of ``LR_TRACE_ITERS_PER_EPOCH``
  iterations per epoch, upstream's ``LinearWarmup`` built and its
  ``FlatCosineLRScheduler`` stepped after every iteration, as DEIMv2's
  ``det_solver.py`` / ``det_engine.py`` drive them; the
  ``BatchImageCollateFunction`` built as upstream's ``DataLoader`` builds
  it (multi-scale ``scales``, ``stop_epoch``, ``ema_restart_decay``,
  MixUp, or the error building it raises), with its Copy-Blend attributes
  (``COPY_BLEND_KEYS``) added; the ops upstream's ``Compose`` runs, epoch
  by epoch. These three need torchvision (upstream's transforms and
  collate modules import it): they run in a second fresh process per
  config, with the real torchvision, and the same ``OVERRIDES``.
"""
import argparse
import importlib
import importlib.util
import json
import os.path as osp
import subprocess
import sys
import types

HERE = osp.dirname(osp.abspath(__file__))
OUTPUT = osp.join(HERE, 'upstream_recipes.json')
SIZES = ('hgnetv2_atto', 'hgnetv2_femto', 'hgnetv2_pico', 'hgnetv2_n',
         'hgnetv2_s', 'hgnetv2_m', 'hgnetv2_l', 'hgnetv2_x', 'dinov3_s',
         'dinov3_m', 'dinov3_l', 'dinov3_x')
OVERRIDES = {
    'HGNetv2': {
        'pretrained': False
    },
    'DINOv3STAs': {
        'weights_path': None
    }
}
#: Modules of the checkout the lr / collate / policy records import (the
#: package ``engine``), for ``test_deim``'s ``load_tree``.
TREE = dict(
    package='engine',
    modules=('core.workspace', 'core.yaml_utils', 'core.yaml_config',
             'optim.optim', 'optim.warmup', 'optim.ema', 'optim.lr_scheduler',
             'backbone.hgnetv2', 'backbone.dinov3_adapter',
             'deim.hybrid_encoder', 'deim.lite_encoder', 'deim.deim_decoder',
             'deim.deim', 'data.dataloader', 'data.transforms.container'))
COPY_BLEND_KEYS = ('copyblend_prob', 'copyblend_epochs', 'copyblend_type',
                   'area_threshold', 'num_objects', 'with_expand',
                   'expand_ratios', 'random_num_objects')
YAML_KEYS = ('epoches', 'warmup_iter', 'flat_epoch', 'no_aug_epoch',
             'lr_gamma', 'lrsheduler', 'ema', 'use_ema', 'use_amp',
             'clip_max_norm', 'sync_bn', 'find_unused_parameters', 'optimizer',
             'eval_spatial_size')


def _yaml_config(root: str):
    """Upstream's ``engine.core.yaml_config`` (for ``get_optim_params``),
    imported without its package's training stack."""
    sys.path.insert(0, osp.dirname(HERE))
    import upstream_deimv2
    upstream = upstream_deimv2.load_upstream(root)
    if importlib.util.find_spec('torch.utils.tensorboard') is None or \
            importlib.util.find_spec('tensorboard') is None:
        sys.modules['torch.utils.tensorboard'] = types.SimpleNamespace(
            SummaryWriter=object)
    sys.path.insert(0, root)
    try:
        module = importlib.import_module('engine.core.yaml_config')
    finally:
        sys.path.remove(root)
    return upstream, upstream_deimv2, module


def one_config(root: str, size: str) -> dict:
    import torch
    upstream, helper, yaml_config = _yaml_config(root)
    yml = osp.join(root, 'configs', 'deimv2', f'deimv2_{size}_coco.yml')
    built = helper.build_from_yaml(upstream, yml, overrides=OVERRIDES)
    cfg, model = built['cfg'], built['model']
    groups = yaml_config.YAMLConfig.get_optim_params(cfg['optimizer'], model)
    options = {
        k: v
        for k, v in cfg['optimizer'].items() if k not in ('type', 'params')
    }
    assert cfg['optimizer']['type'] == 'AdamW', cfg['optimizer']['type']
    optimizer = torch.optim.AdamW(
        [dict(g, params=list(g['params'])) for g in groups], **options)
    names = {id(p): n for n, p in model.named_parameters()}
    criterion, matcher = built['criterion'], built['criterion'].matcher
    train = cfg.get('train_dataloader', {})
    transforms = train.get('dataset', {}).get('transforms', {})
    return dict(
        file=f'configs/deimv2/deimv2_{size}_coco.yml',
        yaml=dict({k: cfg.get(k)
                   for k in YAML_KEYS},
                  policy=transforms.get('policy'),
                  mosaic_prob=transforms.get('mosaic_prob'),
                  collate_fn=train.get('collate_fn'),
                  total_batch_size=train.get('total_batch_size')),
        criterion=dict(
            losses=list(criterion.losses),
            use_uni_set=criterion.use_uni_set,
            weight_dict=dict(criterion.weight_dict),
            gamma=criterion.gamma,
            alpha=criterion.alpha,
            matcher=dict(
                cost_class=matcher.cost_class,
                cost_bbox=matcher.cost_bbox,
                cost_giou=matcher.cost_giou,
                use_focal_loss=matcher.use_focal_loss,
                alpha=matcher.alpha,
                gamma=matcher.gamma,
                change_matcher=matcher.change_matcher,
                iou_order_alpha=matcher.iou_order_alpha,
                matcher_change_epoch=matcher.matcher_change_epoch)),
        param_groups=[
            dict(
                lr=g['lr'],
                weight_decay=g['weight_decay'],
                betas=list(g['betas']),
                params=[names[id(p)] for p in g['params']])
            for g in optimizer.param_groups
        ])


def _deim_script() -> types.ModuleType:
    """``test_deim/data/make_upstream_recipes.py`` as a module, with this
    checkout's tree and model overrides."""
    path = osp.join(
        osp.dirname(osp.dirname(HERE)), 'test_deim', 'data',
        'make_upstream_recipes.py')
    spec = importlib.util.spec_from_file_location('deim_make_recipes', path)
    module = importlib.util.module_from_spec(spec)
    # upstream's ``register`` imports the module of what it registers
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    module.TREES['DEIMv2'] = TREE
    module.PRETRAINED_OFF = OVERRIDES  # read by its lr_trace
    return module


def data_records(root: str, size: str) -> dict:
    """``lr_trace``, ``collate`` and ``policy_table`` of one config (see
    the module doc); needs torchvision."""
    deim = _deim_script()
    up = deim.load_tree('DEIMv2', root)
    yml = osp.join(root, 'configs', 'deimv2', f'deimv2_{size}_coco.yml')
    cfg = up.yaml_utils.load_config(yml)
    collate = deim.build_collate(up, cfg)
    if 'error' not in collate:
        probe = deim._RecipeCollateProbe.__name__
        merged = up.yaml_utils.merge_config(cfg, inplace=False,
                                            overwrite=False)
        merged[probe]['collate_fn'] = cfg['train_dataloader']['collate_fn']
        built = up.workspace.create(probe, merged).collate_fn
        collate.update({
            key: list(value) if isinstance(value, tuple) else value
            for key in COPY_BLEND_KEYS
            for value in [getattr(built, key)]
        })
    return dict(
        collate=collate,
        policy_table=deim.policy_table(up, cfg),
        # 'DEIM': the engine family whose solver steps FlatCosineLR per
        # iteration, as DEIMv2's det_solver.py does
        lr_trace=deim.lr_trace(up, 'DEIM', yml))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        'checkout', help='an Intellindust-AI-Lab/DEIMv2 '
        'checkout')
    parser.add_argument('--one', choices=SIZES, help=argparse.SUPPRESS)
    parser.add_argument('--data', choices=SIZES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    root = osp.abspath(args.checkout)
    if args.one:
        print(json.dumps(one_config(root, args.one)))
        return 0
    if args.data:
        print(json.dumps(data_records(root, args.data)))
        return 0
    commit = subprocess.run(['git', '-C', root, 'rev-parse', 'HEAD'],
                            capture_output=True,
                            text=True).stdout.strip() or None
    configs = {}
    for size in SIZES:
        for mode in ('--one', '--data'):
            out = subprocess.run([sys.executable, __file__, root, mode, size],
                                 check=True,
                                 capture_output=True,
                                 text=True).stdout
            configs.setdefault(size, {}).update(
                json.loads(out.strip().splitlines()[-1]))
        print(f'{size}: {len(configs[size]["param_groups"])} groups, '
              f'collate {configs[size]["collate"]}')
    version = subprocess.run(
        [sys.executable, '-c', 'import importlib.metadata as m; '
         'print(m.version("torchvision"))'],
        capture_output=True,
        text=True).stdout.strip()
    data = dict(
        source=dict(
            repository='https://github.com/Intellindust-AI-Lab/DEIMv2',
            commit=commit or '0fff8d4dcdc272e6cf2d84be31399db471357941',
            script='tests/test_projects/test_deimv2/data/'
            'make_upstream_recipes.py',
            command='PYTHONPATH=<torchvision> python tests/test_projects/'
            'test_deimv2/data/make_upstream_recipes.py <DEIMv2 checkout>',
            torchvision=version or None,
            code='engine/core/yaml_utils.py load_config, '
            'engine/core/yaml_config.py YAMLConfig (optimizer, '
            'lr_scheduler, lr_warmup_scheduler), engine/optim/'
            'lr_scheduler.py FlatCosineLRScheduler, engine/data/'
            'dataloader.py BatchImageCollateFunction, engine/data/'
            'transforms/container.py Compose, engine/deim/deim_criterion.py '
            'and matcher.py'),
        configs=configs)
    with open(OUTPUT, 'w') as f:
        json.dump(data, f, indent=1)
        f.write('\n')
    return 0


if __name__ == '__main__':
    sys.exit(main())
