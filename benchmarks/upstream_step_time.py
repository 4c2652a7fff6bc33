r"""Step time of the model ports against upstream's own code: the same
weights, the same batch, side by side in one process.

    CODETR_UPSTREAM=/path/to/checkout/with/projects/CO-DETR \
    RTDETR_UPSTREAM=/path/to/lyuwenyu/RT-DETR \
    python benchmarks/upstream_step_time.py \
        [--models co_dino_r50 rtdetrv2_r18vd rtdetrv2_r50vd] \
        [--device cuda] [--steps 20] [--warmup 5]

Models and their upstream side:

- ``co_dino_r50``: upstream's ``projects/CO-DETR`` (MMDetection 3.x) with
  upstream's own ``co_dino_5scale_r50_8xb2_1x_coco.py`` model config,
  against the port (``projects/CO-DETR``) built from the same config
  dict. A batch of two 800 x 1216 images with 10 boxes each. The port and
  upstream register the same class names, so each is imported with its
  registrations set aside and built with them put back.
- ``rtdetrv2_r18vd`` / ``rtdetrv2_r50vd``: lyuwenyu/RT-DETR
  ``rtdetrv2_pytorch`` built from its YAML
  (``configs/rtdetrv2/rtdetrv2_r{18,50}vd_*.yml``, includes resolved, the
  ``__share__`` keys passed as upstream's ``create`` does), its criterion
  and post-processor, against the port's ``rtdetrv2_*`` config; upstream's
  weights converted by the RT-DETR package's ``convert_rtdetr_state_dict``
  (what ``tools/convert_rtdetr_checkpoint.py`` runs). A batch of
  four 640 x 640 images with 8 boxes each (the port without multi-scale
  batch resizing, as upstream's training step sees a fixed batch).

Training: loss, backward and an AdamW step. Inference: one image, eval
mode, the post-processor included. Steps alternate A B / B A so drift hits
both alike; printed: each side's median, port / upstream of the medians,
and the median of the per-round ratios. The outputs of the two sides on
the same inference input are compared first (max abs difference of the
top scores), so a ratio is only printed for models that agree.

Reading the figures: on a GPU the loss path is host-bound. Every host
read of device data (``.cpu()``, ``.item()``, ``bool(tensor)``,
``nonzero``, ``unique``, a blocking host-to-device copy such as
``new_tensor``) makes the host wait for the queued kernels, and from
then on Python and dispatch time is no longer hidden behind device work;
this is what made the port's per-image DETR loss cost 8-10 ms per decoder
layer on an H100. A CPU run barely shows it (the 640-px backbone
dominates, and a shared machine moves the ratios by tens of percent from
run to run): there, count the host reads and torch calls of one step
(torch.profiler's ``aten::_local_scalar_dense``/``aten::nonzero`` events
plus a ``TorchFunctionMode`` counter, as ``host_reads`` in
``tests/test_projects/test_rtdetr/rtdetr_utils.py``), and time small
inputs (``--rtdetr-size 320``) over several runs.

Upstream code is read from the checkout at run time; nothing of it is
copied here. Without torchvision (a CPU dry run), upstream RT-DETR's
``box_area``/``box_convert`` imports are satisfied by small stand-ins and
the figures are marked as not comparable.
"""
import argparse
import contextlib
import copy
import importlib
import importlib.util
import os
import os.path as osp
import statistics
import sys
import time
import types

import torch
from _common import REPO_ROOT, det_batch

if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

CODETR_CONFIG = osp.join('projects', 'CO-DETR', 'configs', 'codino',
                         'co_dino_5scale_r50_8xb2_1x_coco.py')
RTDETR_CASES = {
    'rtdetrv2_r18vd':
    ('rtdetrv2_r18vd_120e_coco.yml', 'rtdetrv2_r18vd_120e_coco.py'),
    'rtdetrv2_r50vd':
    ('rtdetrv2_r50vd_6x_coco.yml', 'rtdetrv2_r50vd_6x_coco.py'),
}


# ---------------------------------------------------------------- timing
def _sync(device):
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def _timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def side_by_side(steps_by_name: dict, device, rounds: int, warmup: int):
    """Median seconds per name and the per-round ratios of the first
    name to the second, alternating the order every round."""
    names = list(steps_by_name)
    for _ in range(warmup):
        for name in names:
            steps_by_name[name]()
    _sync(device)
    times = {name: [] for name in names}
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            times[name].append(_timed(steps_by_name[name], device))
    ratios = [a / b for a, b in zip(times[names[0]], times[names[1]])]
    return {n: statistics.median(t) for n, t in times.items()}, ratios


def report(model: str, phase: str, medians: dict, ratios) -> None:
    port, upstream = medians['port'], medians['upstream']
    print(f'{model:16s} {phase:9s} port {port * 1e3:8.2f} ms  upstream '
          f'{upstream * 1e3:8.2f} ms  port/upstream {port / upstream:.3f} '
          f'(median of per-round ratios {statistics.median(ratios):.3f}, '
          f'{len(ratios)} rounds)')


def train_step(model, optimizer, forward_loss):

    def step():
        loss = forward_loss()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# ------------------------------------------------- registry separation
@contextlib.contextmanager
def registered(registry, entries: dict):
    """``registry`` with ``entries`` put in, restored afterwards."""
    saved = dict(registry._module_dict)
    registry._module_dict.update(entries)
    try:
        yield
    finally:
        registry._module_dict.clear()
        registry._module_dict.update(saved)


def import_set_aside(registry, load) -> dict:
    """Run ``load()`` and return what it registered, removed again from
    ``registry``."""
    saved = dict(registry._module_dict)
    load()
    added = {
        name: cls
        for name, cls in registry._module_dict.items()
        if saved.get(name) is not cls
    }
    registry._module_dict.clear()
    registry._module_dict.update(saved)
    return added


def import_package_as(alias: str, path: str):
    """Import the package at ``path`` under the name ``alias``."""
    spec = importlib.util.spec_from_file_location(
        alias,
        osp.join(path, '__init__.py'),
        submodule_search_locations=[path])
    module = importlib.util.module_from_spec(spec)
    sys.modules[alias] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- CO-DINO
def codetr_sides(upstream_root: str, device):
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    import mmddp_ext  # noqa: F401  (the port's building blocks)
    register_all_modules()
    upstream_pkg = osp.join(upstream_root, 'projects', 'CO-DETR', 'codetr')
    upstream_entries = import_set_aside(
        MODELS, lambda: import_package_as('upstream_codetr', upstream_pkg))
    port_entries = import_set_aside(
        MODELS, lambda: importlib.import_module('projects.CO-DETR.codetr'))
    cfg = Config.fromfile(osp.join(upstream_root, CODETR_CONFIG)).model
    cfg.backbone.init_cfg = None
    models = {}
    for name, entries in (('upstream', upstream_entries), ('port',
                                                           port_entries)):
        with registered(MODELS, entries):
            torch.manual_seed(0)
            models[name] = MODELS.build(copy.deepcopy(cfg)).to(device)
    models['port'].load_state_dict(models['upstream'].state_dict())
    return models


def run_codetr(args, device) -> None:
    root = os.environ.get('CODETR_UPSTREAM')
    if not root:
        raise SystemExit('co_dino_r50 needs CODETR_UPSTREAM: a checkout '
                         'holding projects/CO-DETR of MMDetection 3.x.')
    models = codetr_sides(root, device)
    num_classes = 80
    height, width = args.codetr_size
    batch = det_batch(2, height, width, 10, num_classes)
    single = det_batch(1, height, width, 10, num_classes, seed=1)
    packed = {}
    for name, model in models.items():
        packed[name] = (model.data_preprocessor(batch, training=True),
                        model.data_preprocessor(single, training=False))
    _compare_predictions(
        'co_dino_r50', {
            name:
            lambda m=model, p=packed[name][1]: m.predict(
                p['inputs'], p['data_samples'])[0].pred_instances.scores
            for name, model in models.items()
        })
    steps = {}
    for name, model in models.items():
        model.train()
        data = packed[name][0]
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=2e-4, weight_decay=1e-4)

        def forward_loss(m=model, d=data):
            loss, _ = m.parse_losses(m.loss(d['inputs'], d['data_samples']))
            return loss

        steps[name] = train_step(model, optimizer, forward_loss)
    report('co_dino_r50', 'training',
           *side_by_side(steps, device, args.steps, args.warmup))
    infer = {}
    for name, model in models.items():
        model.eval()
        data = packed[name][1]

        def predict(m=model, d=data):
            with torch.no_grad():
                m.predict(d['inputs'], d['data_samples'])

        infer[name] = predict
    report('co_dino_r50', 'inference',
           *side_by_side(infer, device, args.steps, args.warmup))


def _compare_predictions(model_name: str, score_fns: dict) -> None:
    scores = {}
    for name, fn in score_fns.items():
        with torch.no_grad():
            scores[name] = fn().float().cpu()
    count = min(len(s) for s in scores.values())
    top = {
        name: values.sort(descending=True).values[:count]
        for name, values in scores.items()
    }
    diff = (top['port'] - top['upstream']).abs().max().item()
    print(f'{model_name:16s} same weights: max |top-score difference| '
          f'{diff:.2e} over {count} detections')
    if diff > 1e-3:
        raise SystemExit(f'{model_name}: port and upstream disagree on the '
                         'same weights; the timing would compare different '
                         'models.')


# ---------------------------------------------------------------- RT-DETR
def _stub_missing_torchvision() -> bool:
    """Stand-ins for the two torchvision box functions upstream's RT-DETR
    model, criterion and post-processor import, when torchvision is not
    installed (a CPU dry run). Returns whether stubs were installed."""
    if importlib.util.find_spec('torchvision') is not None:
        return False
    vision = types.ModuleType('torchvision')
    ops = types.ModuleType('torchvision.ops')
    boxes = types.ModuleType('torchvision.ops.boxes')

    def box_area(b):
        return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])

    def box_convert(b, in_fmt, out_fmt):
        assert (in_fmt, out_fmt) == ('cxcywh', 'xyxy')
        cxcy, wh = b[..., :2], b[..., 2:]
        return torch.cat([cxcy - wh / 2, cxcy + wh / 2], dim=-1)

    boxes.box_area = box_area
    ops.box_convert = box_convert
    ops.boxes = boxes
    vision.ops = ops
    sys.modules.update({
        'torchvision': vision,
        'torchvision.ops': ops,
        'torchvision.ops.boxes': boxes
    })
    return True


def load_rtdetr_upstream(tree: str):
    """Upstream's ``src`` model modules, without the package ``__init__``
    files (they import the data and training stack); ``register`` and the
    two distributed helpers the criterion imports are stood in for."""
    for name in [m for m in sys.modules if m == 'src' or m.startswith('src.')]:
        del sys.modules[name]
    for name in ('src', 'src.nn', 'src.nn.backbone', 'src.zoo',
                 'src.zoo.rtdetr', 'src.misc'):
        package = types.ModuleType(name)
        package.__path__ = [osp.join(tree, *name.split('.'))]
        sys.modules[name] = package
    core = types.ModuleType('src.core')

    def register(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda cls: cls

    core.register = register
    sys.modules['src.core'] = core
    dist_utils = types.ModuleType('src.misc.dist_utils')
    dist_utils.get_world_size = lambda: 1
    dist_utils.is_dist_available_and_initialized = lambda: False
    sys.modules['src.misc.dist_utils'] = dist_utils
    names = dict(
        presnet='src.nn.backbone.presnet',
        encoder='src.zoo.rtdetr.hybrid_encoder',
        decoder='src.zoo.rtdetr.rtdetrv2_decoder',
        rtdetr='src.zoo.rtdetr.rtdetr',
        criterion='src.zoo.rtdetr.rtdetrv2_criterion',
        matcher='src.zoo.rtdetr.matcher',
        post='src.zoo.rtdetr.rtdetr_postprocessor')
    return types.SimpleNamespace(**{
        k: importlib.import_module(v)
        for k, v in names.items()
    })


def read_upstream_yaml(path: str) -> dict:
    """Upstream's YAML with its ``__include__`` files merged first (later
    files and the including file win, dicts merged key by key)."""
    import yaml
    with open(path) as f:
        cfg = yaml.safe_load(f) or {}
    merged = {}
    for include in cfg.pop('__include__', []):
        _merge(merged,
               read_upstream_yaml(osp.join(osp.dirname(path), include)))
    _merge(merged, cfg)
    return merged


def _merge(into: dict, other: dict) -> None:
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


def _create(cls, cfg: dict, **given):
    """Instantiate ``cls`` as upstream's ``create`` does: its YAML section,
    plus the global keys it lists in ``__share__``."""
    kwargs = dict(cfg.get(cls.__name__, {}))
    kwargs.pop('type', None)
    for key in getattr(cls, '__share__', []):
        if key in cfg:
            kwargs[key] = cfg[key]
    kwargs.update(given)
    return cls(**kwargs)


def rtdetr_upstream(tree: str, yml: str, device, size: int = 640):
    src = load_rtdetr_upstream(tree)
    cfg = read_upstream_yaml(osp.join(tree, 'configs', 'rtdetrv2', yml))
    cfg.setdefault('PResNet', {})['pretrained'] = False
    # the eval-mode position embedding and anchors are built for this size
    cfg['eval_spatial_size'] = [size, size]
    torch.manual_seed(0)
    model = src.rtdetr.RTDETR(
        _create(src.presnet.PResNet, cfg),
        _create(src.encoder.HybridEncoder, cfg),
        _create(src.decoder.RTDETRTransformerv2, cfg))
    matcher_cfg = dict(cfg['RTDETRCriterionv2']['matcher'])
    matcher_cfg.pop('type')
    matcher = _create(src.matcher.HungarianMatcher, cfg, **matcher_cfg)
    criterion_cfg = dict(cfg['RTDETRCriterionv2'])
    criterion_cfg.pop('matcher')
    criterion = _create(
        src.criterion.RTDETRCriterionv2, cfg, matcher=matcher, **criterion_cfg)
    # Label-to-COCO-id remapping belongs to evaluation (the port's
    # CocoMetric does it), and imports upstream's data stack.
    post = _create(
        src.post.RTDETRPostProcessor, cfg, remap_mscoco_category=False)
    return model.to(device), criterion.to(device), post.to(device)


def rtdetr_port(config: str, upstream_state: dict, device):
    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings

    cfg = Config.fromfile(config)
    import_modules_from_strings(**cfg.custom_imports)
    rtdetr = importlib.import_module('projects.RT-DETR.rtdetr')
    init_default_scope('mmdet')
    model_cfg = cfg.model
    model_cfg.backbone.init_cfg = None
    # Upstream's training step sees the batch as given.
    model_cfg.data_preprocessor.batch_augments = None
    model = MODELS.build(model_cfg).to(device)
    reference = model.state_dict()
    converted = rtdetr.convert_rtdetr_state_dict(
        upstream_state, reference=reference, log=lambda line: None)
    model.load_state_dict(converted, strict=False)
    return model


def run_rtdetr(args, name: str, device) -> None:
    root = os.environ.get('RTDETR_UPSTREAM')
    if not root:
        raise SystemExit(f'{name} needs RTDETR_UPSTREAM: a lyuwenyu/RT-DETR '
                         'checkout.')
    stubbed = _stub_missing_torchvision()
    yml, config = RTDETR_CASES[name]
    tree = osp.join(root, 'rtdetrv2_pytorch')
    upstream, criterion, post = rtdetr_upstream(tree, yml, device,
                                                args.rtdetr_size)
    port = rtdetr_port(
        osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs', config), {
            k: v.cpu()
            for k, v in upstream.state_dict().items()
        }, device)
    size = args.rtdetr_size
    batch = det_batch(4, size, size, 8, 80)
    single = det_batch(1, size, size, 8, 80, seed=1)
    port_train = port.data_preprocessor(batch, training=True)
    port_test = port.data_preprocessor(single, training=False)
    # Upstream's training input: RGB in [0, 1], targets with normalised
    # cxcywh boxes, the form its transforms produce.
    up_images = port_train['inputs']
    up_targets = [
        _upstream_target(s, device) for s in port_train['data_samples']
    ]
    up_single = port_test['inputs']
    sizes = torch.tensor([[size, size]], device=device)

    _compare_predictions(
        name, {
            'upstream':
            lambda: post(upstream.eval()(up_single), sizes)[0]['scores'],
            'port':
            lambda: port.eval().predict(port_test['inputs'], port_test[
                'data_samples'])[0].pred_instances.scores
        })
    upstream.train()
    port.train()
    up_opt = torch.optim.AdamW(
        upstream.parameters(), lr=1e-4, weight_decay=1e-4)
    port_opt = torch.optim.AdamW(port.parameters(), lr=1e-4, weight_decay=1e-4)

    def up_loss():
        losses = criterion(upstream(up_images, up_targets), up_targets)
        return sum(losses.values())

    def port_loss():
        loss, _ = port.parse_losses(
            port.loss(port_train['inputs'], port_train['data_samples']))
        return loss

    steps = dict(
        port=train_step(port, port_opt, port_loss),
        upstream=train_step(upstream, up_opt, up_loss))
    label = name + (' (stubbed tv)' if stubbed else '')
    report(label, 'training',
           *side_by_side(steps, device, args.steps, args.warmup))
    port.eval()
    upstream.eval()

    def port_predict():
        with torch.no_grad():
            port.predict(port_test['inputs'], port_test['data_samples'])

    def up_predict():
        with torch.no_grad():
            post(upstream(up_single), sizes)

    report(
        label, 'inference',
        *side_by_side(
            dict(port=port_predict, upstream=up_predict), device, args.steps,
            args.warmup))


def _upstream_target(sample, device) -> dict:
    height, width = sample.metainfo['img_shape']
    boxes = sample.gt_instances.bboxes.to(device)
    scale = boxes.new_tensor([width, height, width, height])
    xyxy = boxes / scale
    cxcywh = torch.cat(
        [(xyxy[:, :2] + xyxy[:, 2:]) / 2, xyxy[:, 2:] - xyxy[:, :2]], dim=1)
    return dict(labels=sample.gt_instances.labels.to(device), boxes=cxcywh)


def main() -> None:
    from mmengine.logging import MMLogger
    MMLogger.get_instance('mmengine', log_level='WARNING')
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        '--models',
        nargs='+',
        default=['co_dino_r50', 'rtdetrv2_r18vd', 'rtdetrv2_r50vd'])
    parser.add_argument(
        '--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--steps', type=int, default=20)
    parser.add_argument('--warmup', type=int, default=5)
    parser.add_argument(
        '--codetr-size',
        type=int,
        nargs=2,
        default=(800, 1216),
        metavar=('H', 'W'),
        help='CO-DINO image size (smaller for a CPU dry run)')
    parser.add_argument(
        '--rtdetr-size',
        type=int,
        default=640,
        help='RT-DETR image size (smaller for a CPU dry run)')
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == 'cuda':
        print(f'device: {torch.cuda.get_device_name(device)}, torch '
              f'{torch.__version__}')
    for name in args.models:
        if name == 'co_dino_r50':
            run_codetr(args, device)
        elif name in RTDETR_CASES:
            run_rtdetr(args, name, device)
        else:
            raise SystemExit(f'unknown model {name!r}; choose from '
                             f"co_dino_r50, {', '.join(RTDETR_CASES)}")


if __name__ == '__main__':
    main()
