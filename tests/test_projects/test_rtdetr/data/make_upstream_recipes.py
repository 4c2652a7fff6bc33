r"""Write ``upstream_recipes.json``: the lr and weight decay that
upstream RT-DETR's own optimizer code gives every trainable parameter of
each official COCO config, and the config's multi-scale training sizes;
and ``upstream_dn_draws.json``: what upstream's
``get_contrastive_denoising_training_group`` returns for the inputs
recorded in that file (``DN_INPUTS``), seeded, label and box noise on.

    git clone https://github.com/lyuwenyu/RT-DETR /tmp/upstream/RT-DETR
    git -C /tmp/upstream/RT-DETR checkout \
        068dfde65f2667ad6555883c69d73de886518cad
    python tests/test_projects/test_rtdetr/data/make_upstream_recipes.py \
        /tmp/upstream/RT-DETR

For each config, upstream's ``YAMLConfig(yml)`` (``src/core``) reads the
YAML with its ``__include__`` merging, ``create`` builds upstream's model
(``PResNet``, ``HybridEncoder``, ``RTDETRTransformer(v2)``) and
``YAMLConfig.optimizer`` calls upstream's ``get_optim_params`` and builds
the ``AdamW``; the script then reads each parameter's group in that
optimizer. ``PResNet.pretrained`` is set to False (no download: the
weights do not change the groups). Only what model and optimizer
construction never run is stubbed, when the package is missing:
torchvision (``box_ops`` imports ``box_area``; the criterion, matcher,
post-processor and data modules that need more of it are not imported)
and ``torch.utils.tensorboard`` (v2 ``src/core/_config.py`` imports
``SummaryWriter``). The package ``__init__`` files of ``src``, ``src.nn``,
``src.zoo`` and ``src.optim`` are skipped for the same reason; the
modules that register the model and optimizer are imported one by one.
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
DN_OUTPUT = osp.join(HERE, 'upstream_dn_draws.json')
#: Inputs of the denoising draw: two images (h, w) with xyxy pixel boxes,
#: the generator's settings and the torch seed.
DN_INPUTS = dict(
    seed=0,
    num_classes=3,
    num_queries=5,
    num_denoising=4,
    label_noise_ratio=1.0,
    box_noise_scale=1.0,
    images=[
        dict(
            img_shape=[10, 20],
            bboxes=[[2., 1., 6., 5.], [10., 2., 18., 9.]],
            labels=[0, 1]),
        dict(img_shape=[10, 20], bboxes=[[0., 0., 20., 10.]], labels=[2]),
    ])
#: (tree, yml under the tree's configs/) of every official COCO model
CONFIGS = [
    ('rtdetr_pytorch', 'rtdetr/rtdetr_r18vd_6x_coco.yml'),
    ('rtdetr_pytorch', 'rtdetr/rtdetr_r34vd_6x_coco.yml'),
    ('rtdetr_pytorch', 'rtdetr/rtdetr_r50vd_m_6x_coco.yml'),
    ('rtdetr_pytorch', 'rtdetr/rtdetr_r50vd_6x_coco.yml'),
    ('rtdetr_pytorch', 'rtdetr/rtdetr_r101vd_6x_coco.yml'),
    ('rtdetrv2_pytorch', 'rtdetrv2/rtdetrv2_r18vd_120e_coco.yml'),
    ('rtdetrv2_pytorch', 'rtdetrv2/rtdetrv2_r34vd_120e_coco.yml'),
    ('rtdetrv2_pytorch', 'rtdetrv2/rtdetrv2_r50vd_m_7x_coco.yml'),
    ('rtdetrv2_pytorch', 'rtdetrv2/rtdetrv2_r50vd_6x_coco.yml'),
    ('rtdetrv2_pytorch', 'rtdetrv2/rtdetrv2_r101vd_6x_coco.yml'),
]
MODULES = {
    'rtdetr_pytorch': [
        'src.optim.optim', 'src.nn.backbone.presnet',
        'src.zoo.rtdetr.hybrid_encoder', 'src.zoo.rtdetr.rtdetr_decoder',
        'src.zoo.rtdetr.rtdetr'
    ],
    'rtdetrv2_pytorch': [
        'src.optim.optim', 'src.nn.backbone.presnet',
        'src.zoo.rtdetr.hybrid_encoder', 'src.zoo.rtdetr.rtdetrv2_decoder',
        'src.zoo.rtdetr.rtdetr'
    ],
}
SKIPPED_INITS = [
    'src', 'src.nn', 'src.nn.backbone', 'src.zoo', 'src.zoo.rtdetr',
    'src.optim'
]


def _stub_missing(name: str, **attributes) -> None:
    if name in sys.modules or importlib.util.find_spec(
            name.split('.')[0]) is not None:
        return
    parts = name.split('.')
    for depth in range(1, len(parts) + 1):
        sys.modules.setdefault('.'.join(parts[:depth]),
                               types.ModuleType('.'.join(parts[:depth])))
    for key, value in attributes.items():
        setattr(sys.modules[name], key, value)


def import_tree(root: str) -> types.ModuleType:
    """Import one upstream tree as ``src`` (its real ``src.core``) and
    register the model and optimizer modules; returns ``src.core``."""
    for name in [m for m in sys.modules if m == 'src' or m.startswith('src.')]:
        del sys.modules[name]
    sys.path.insert(0, root)
    _stub_missing('torchvision.ops.boxes', box_area=None)
    if importlib.util.find_spec('tensorboard') is None:
        sys.modules['torch.utils.tensorboard'] = types.SimpleNamespace(
            SummaryWriter=object)
    for name in SKIPPED_INITS:
        package = types.ModuleType(name)
        package.__path__ = [osp.join(root, *name.split('.'))]
        sys.modules[name] = package
    core = importlib.import_module('src.core')
    for name in MODULES[osp.basename(root)]:
        importlib.import_module(name)
    sys.path.remove(root)
    return core


def recipe(core, yml: str) -> dict:
    """What upstream's YAMLConfig makes of ``yml``: ``param_groups``, the
    trainable parameters' (upstream) names by their (lr, weight_decay) in
    the optimizer it builds (``[{'lr': ..., 'weight_decay': ...,
    'params': [names]}, ...]``), and ``multi_scale``, the batch sizes
    drawn from in training (v1 ``RTDETR.multi_scale``, v2
    ``train_dataloader.collate_fn.scales``; None: single scale)."""
    cfg = core.YAMLConfig(yml, PResNet=dict(pretrained=False))
    merged = cfg.yaml_cfg
    collate = merged.get('train_dataloader', {}).get('collate_fn')
    if isinstance(collate, dict):  # v2: BatchImageCollateFunction
        multi_scale = collate.get('scales')
    else:  # v1: the model resizes the batch
        multi_scale = merged.get('RTDETR', {}).get('multi_scale')
    optimizer = cfg.optimizer
    group_of = {
        id(param): group
        for group in optimizer.param_groups
        for param in group['params']
    }
    by_values = {}
    for name, param in cfg.model.named_parameters():
        if param.requires_grad:
            group = group_of[id(param)]
            values = (group['lr'], group['weight_decay'])
            by_values.setdefault(values, []).append(name)
    groups = [
        dict(lr=lr, weight_decay=weight_decay, params=names)
        for (lr, weight_decay), names in by_values.items()
    ]
    return dict(multi_scale=multi_scale, param_groups=groups)


def dn_draws() -> dict:
    """Upstream's denoising group for ``DN_INPUTS`` (in the tree that
    :func:`import_tree` imported): noisy labels (the class embedding is
    the identity, so each query's label is its argmax), boxes as upstream
    returns them (inverse sigmoid), the attention mask and ``dn_meta``."""
    import torch
    denoising = importlib.import_module('src.zoo.rtdetr.denoising')
    targets = []
    for image in DN_INPUTS['images']:
        height, width = image['img_shape']
        x1, y1, x2, y2 = torch.tensor(image['bboxes']).unbind(-1)
        boxes = torch.stack([(x1 + x2) / 2 / width, (y1 + y2) / 2 / height,
                             (x2 - x1) / width, (y2 - y1) / height], -1)
        targets.append(dict(labels=torch.tensor(image['labels']), boxes=boxes))
    classes = DN_INPUTS['num_classes']
    one_hot = torch.nn.Embedding(classes + 1, classes + 1)
    one_hot.weight.data = torch.eye(classes + 1)
    torch.manual_seed(DN_INPUTS['seed'])
    logits, boxes, attn_mask, meta = \
        denoising.get_contrastive_denoising_training_group(
            targets, classes, DN_INPUTS['num_queries'], one_hot,
            num_denoising=DN_INPUTS['num_denoising'],
            label_noise_ratio=DN_INPUTS['label_noise_ratio'],
            box_noise_scale=DN_INPUTS['box_noise_scale'])
    return dict(
        labels=logits.argmax(-1).tolist(),
        boxes=boxes.tolist(),
        attn_mask=attn_mask.int().tolist(),
        dn_num_group=meta['dn_num_group'],
        dn_num_split=list(meta['dn_num_split']),
        dn_positive_idx=[idx.tolist() for idx in meta['dn_positive_idx']])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('checkout', help='a lyuwenyu/RT-DETR checkout')
    parser.add_argument('--output', default=OUTPUT)
    args = parser.parse_args()
    commit = subprocess.run(['git', '-C', args.checkout, 'rev-parse', 'HEAD'],
                            capture_output=True,
                            text=True).stdout.strip()
    data = dict(
        source=dict(
            repository='https://github.com/lyuwenyu/RT-DETR',
            commit=commit or 'unknown (not a git checkout)',
            code="src/core/yaml_config.py YAMLConfig.get_optim_params and "
            'YAMLConfig.optimizer of each tree',
            command='python tests/test_projects/test_rtdetr/data/'
            'make_upstream_recipes.py <RT-DETR checkout>',
            stubbed='torchvision and torch.utils.tensorboard when missing '
            '(imported, never called while building model and optimizer)'),
        configs={})
    core, loaded = None, None
    draws = dict(
        source=dict(
            data['source'],
            code='src/zoo/rtdetr/'
            'denoising.py get_contrastive_denoising_'
            'training_group of each tree'),
        inputs=DN_INPUTS,
        trees={})
    for tree, yml in CONFIGS:
        if tree != loaded:
            core, loaded = import_tree(osp.join(args.checkout, tree)), tree
            draws['trees'][tree] = dn_draws()
        path = osp.join(args.checkout, tree, 'configs', yml)
        data['configs'][f'{tree}/configs/{yml}'] = found = recipe(core, path)
        print(f'{tree}/configs/{yml}: multi-scale {found["multi_scale"]}; ' +
              ', '.join(f"{len(g['params'])} with lr {g['lr']}, "
                        f"wd {g['weight_decay']}"
                        for g in found['param_groups']))
    for path, content in ((args.output, data), (DN_OUTPUT, draws)):
        with open(path, 'w') as f:
            json.dump(content, f, indent=1)
            f.write('\n')
        print(f'wrote {path}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
