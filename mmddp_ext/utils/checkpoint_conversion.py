"""What converting between an upstream checkpoint and a port's names takes
besides the key table.

Upstream to port: loading the file safely, dropping a DDP ``module.``
prefix, filling the BN counters frozen layers do not store, checking the
result against a config's model and saving it for ``load_from``.

Port to upstream (``--to-upstream``): reading an MMEngine checkpoint's raw
and EMA weights (:func:`split_mmengine_checkpoint`), the feature sizes
upstream's cached anchors cover (:func:`feature_level_shapes`,
:func:`fixed_test_size`), dropping the counters upstream's frozen BN
layers lack, and writing the layout upstream's solvers save
(:func:`convert_to_upstream_checkpoint`); :func:`compare_state_dicts`
checks a round trip tensor for tensor.

The key tables and their inverses live with the ports they serve
(``projects/<Name>/``); ``tools/convert_*_checkpoint.py`` are their
command lines.
"""
import contextlib
import pickle
from datetime import datetime
from typing import Callable, Dict, List, Optional, Tuple, Union

import torch
import torch.nn as nn
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.utils import import_modules_from_strings

from .checkpoint_safety import UnsafeCheckpointError, load_checkpoint_file

Log = Callable[[str], None]
StateDict = Dict[str, torch.Tensor]


class CheckpointConversionError(RuntimeError):
    """Upstream keys without a rule, or shapes that do not fit."""


def load_upstream_checkpoint(src: str, trust_pickle: bool = False) -> Dict:
    """``torch.load`` of an upstream file on the CPU, tensors only unless
    ``trust_pickle``.

    Args:
        src (str): Path of the upstream checkpoint.
        trust_pickle (bool): Load with ``weights_only=False``, for files
            the safe loader refuses. Defaults to False.

    Returns:
        dict: The loaded checkpoint.

    Raises:
        CheckpointConversionError: the safe loader refused the file; the
            message says how to proceed.
    """
    try:
        return torch.load(
            src, map_location='cpu', weights_only=not trust_pickle)
    except pickle.UnpicklingError as error:
        raise CheckpointConversionError(
            f'{src} holds objects other than tensors (e.g. an optimizer or '
            'scheduler state), which the safe loader refuses. If you trust '
            f'the file, rerun with --trust-pickle.\n{error}') from error


def strip_module_prefix(key: str) -> str:
    """Drop the ``module.`` prefix of (D)DP-wrapped checkpoints."""
    return key[len('module.'):] if key.startswith('module.') else key


def convert_submodule_state_dict(convert: Callable[..., StateDict],
                                 upstream: StateDict,
                                 reference: Optional[StateDict] = None,
                                 prefix: str = 'backbone.',
                                 log: Log = print) -> StateDict:
    """Convert the state dict of one submodule (an ImageNet backbone file)
    with a whole-model key table.

    Args:
        convert (callable): The whole model's converter, called as
            ``convert(upstream, reference, log=log)`` on keys under
            ``prefix``.
        upstream (dict): The submodule's upstream state dict (a ``module.``
            prefix is dropped).
        reference (dict, optional): The submodule's own state dict; when
            given, shapes are checked and every key must be produced.
            Defaults to None.
        prefix (str): Where the submodule sits in the whole model.
            Defaults to ``'backbone.'``.
        log (callable): Receives one line per mapped key. Defaults to
            ``print``.

    Returns:
        dict: The converted state dict, keys relative to the submodule.
    """
    converted = convert(
        {prefix + strip_module_prefix(k): v
         for k, v in upstream.items()},
        None if reference is None else
        {prefix + k: v
         for k, v in reference.items()},
        log=log)
    return {k[len(prefix):]: v for k, v in converted.items()}


def fill_num_batches_tracked(converted: StateDict, log: Log) -> None:
    """Frozen BN layers (upstream ``freeze_norm``, ``FrozenBatchNorm2d``)
    store no ``num_batches_tracked``; the ports' BN layers do. Fill it
    with 0.

    Args:
        converted (dict): Converted state dict, completed in place.
        log (callable): Receives one line per filled counter.
    """
    for key in [k for k in converted if k.endswith('.running_mean')]:
        counter = key[:-len('running_mean')] + 'num_batches_tracked'
        if counter not in converted:
            converted[counter] = torch.tensor(0, dtype=torch.long)
            log(f'fill  {counter} = 0 (frozen BN upstream)')


def check_against_reference(converted: StateDict,
                            reference: StateDict) -> List[str]:
    """What keeps ``converted`` from loading strictly into ``reference``.

    Args:
        converted (dict): Converted state dict.
        reference (dict): State dict of the model it is for.

    Returns:
        list[str]: One line per converted key the model lacks, shape that
        differs and model key the conversion did not produce.
    """
    problems = []
    for key, value in converted.items():
        if key not in reference:
            problems.append(f'converted key not in the model: {key}')
        elif tuple(value.shape) != tuple(reference[key].shape):
            problems.append(
                f'shape mismatch: {key} converted {tuple(value.shape)}, '
                f'model {tuple(reference[key].shape)}')
    problems += [
        f'model key missing from the checkpoint: {key}' for key in reference
        if key not in converted
    ]
    return problems


def build_reference_model(config: Union[str, Config],
                          backbone_only: bool = False,
                          device: Optional[str] = None) -> nn.Module:
    """The model that ``config`` builds (random weights), or its backbone,
    to check a conversion against.

    Args:
        config (str | Config): A model config or its path; its
            ``custom_imports`` are imported first.
        backbone_only (bool): Build ``model.backbone`` alone. Defaults to
            False.
        device (str, optional): Build on this device; ``'meta'`` gives the
            structure and shapes without memory or weights. Defaults to
            None (the default device).

    Returns:
        nn.Module: The model or backbone.
    """
    cfg = config if isinstance(config, Config) else Config.fromfile(config)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
    with torch.device(device) if device else contextlib.nullcontext():
        if backbone_only:
            return MODELS.build(cfg.model.backbone)
        return MODELS.build(cfg.model)


def save_converted_checkpoint(converted: StateDict, dst: str, src: str,
                              source: str, log: Log) -> None:
    """Write ``converted`` as a checkpoint ``load_from`` and ``init_cfg``
    read, noting where it came from.

    Args:
        converted (dict): Converted state dict.
        dst (str): Output path.
        src (str): Path of the upstream file, kept in ``meta``.
        source (str): Where in ``src`` the weights were found, kept in
            ``meta``.
        log (callable): Receives the line saying what was saved.
    """
    torch.save(
        {
            'state_dict': converted,
            'meta': dict(converted_from=src, source=source)
        }, dst)
    log(f'saved {len(converted)} tensors to {dst}')


# Port to upstream -------------------------------------------------------


def drop_num_batches_tracked(state: StateDict, prefix: str,
                             log: Log) -> StateDict:
    """The inverse of :func:`fill_num_batches_tracked` for the BN layers
    under ``prefix`` that upstream freezes (``FrozenBatchNorm2d`` has no
    counter, so a strict load refuses one).

    Frozen layers run in eval mode in the ports (``norm_eval``,
    ``freeze_norm``), so the counter stays at the 0 the forward
    conversion filled; a counter that moved is logged, as upstream cannot
    keep it.

    Args:
        state (dict): The port's state dict (not changed).
        prefix (str): The frozen module, e.g. ``'backbone.'``.
        log (callable): Receives one line per dropped counter.

    Returns:
        dict: ``state`` without those counters.
    """
    kept = {}
    for key, value in state.items():
        if key.startswith(prefix) and key.endswith('.num_batches_tracked'):
            moved = '' if value.is_meta or not int(value) else \
                f', was {int(value)}'
            log(f'drop  {key} (frozen BN upstream{moved})')
        else:
            kept[key] = value
    return kept


def rename_to_upstream(state: StateDict, upstream_name: Callable[[str], str],
                       log: Log) -> Tuple[StateDict, List[str]]:
    """``state`` under upstream's names, by a family's inverse key table.

    Args:
        state (dict): The port's state dict.
        upstream_name (callable): Upstream's name of a port key; raises
            ``ValueError`` for a key it has no name for.
        log (callable): Receives one line per mapped key.

    Returns:
        tuple[dict, list[str]]: The renamed state dict, and one line per
        key without an upstream name and per name given to two keys.
    """
    renamed, source, problems = {}, {}, []
    for key, value in state.items():
        try:
            target = upstream_name(key)
        except ValueError as error:
            problems.append(str(error))
            continue
        if target in source:
            problems.append(f'{source[target]} and {key} both map to '
                            f'{target}')
            continue
        renamed[target], source[target] = value, key
        log(f'map   {key} -> {target} {tuple(value.shape)}')
    return renamed, problems


def fixed_test_size(cfg: Config) -> Optional[Tuple[int, int]]:
    """(height, width) the test pipeline resizes every image to (a
    ``Resize`` without ``keep_ratio``), upstream's ``eval_spatial_size``.

    Args:
        cfg (Config): A whole config (data included).

    Returns:
        tuple[int, int] | None: The size, or None when the test pipeline
        has no fixed-size ``Resize`` (or the config no test data).
    """
    dataloader = cfg.get('test_dataloader') or cfg.get('val_dataloader')
    pipeline = (dataloader or {}).get('dataset', {}).get('pipeline', [])
    for step in pipeline:
        scale = step.get('scale')
        if step.get('type') == 'Resize' and scale and not step.get(
                'keep_ratio'):
            # mmcv's scale is (width, height), or one int for both
            width, height = (scale, scale) if isinstance(scale, int) else \
                scale
            return int(height), int(width)
    return None


def upstream_eval_size(
        cfg: Config,
        override: Optional[Tuple[int, int]] = None) -> Tuple[int, int]:
    """Upstream's ``eval_spatial_size`` for a config: ``override`` (from
    ``--eval-size``), else :func:`fixed_test_size`.

    Raises:
        CheckpointConversionError: neither gives a size.
    """
    size = tuple(override) if override else fixed_test_size(cfg)
    if size is None:
        raise CheckpointConversionError(
            "The config's test pipeline resizes to no fixed size, and "
            "upstream caches its anchors for one (eval_spatial_size): pass "
            '--eval-size HEIGHT WIDTH, the eval_spatial_size of the upstream '
            'config the checkpoint is for (e.g. 640 640).')
    return size


def feature_level_shapes(model: nn.Module,
                         image_size: Tuple[int, int]) -> List[Tuple[int, int]]:
    """(height, width) of each level ``model.extract_feat`` gives for one
    image of ``image_size``: what upstream's anchors of that
    ``eval_spatial_size`` cover.

    Runs where the model is; on the meta device
    (:func:`build_reference_model` with ``device='meta'``) that is shapes
    only, no compute.

    Args:
        model (nn.Module): A detector with ``extract_feat``.
        image_size (tuple[int, int]): (height, width).

    Returns:
        list[tuple[int, int]]: One (height, width) per level.
    """
    device = next(model.parameters()).device
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            feats = model.extract_feat(
                torch.zeros(1, 3, *image_size, device=device))
    finally:
        model.train(training)
    return [tuple(feat.shape[-2:]) for feat in feats]


def derived_decoder_buffers(model: nn.Module, eval_size: Tuple[int, int],
                            layer_points: List[List[int]],
                            log: Log) -> StateDict:
    """The persistent buffers of an upstream RT-DETRv2 / D-FINE-family
    decoder that the port derives instead of storing: the anchors and valid
    mask of ``eval_size`` (the model's own ``generate_anchors``) and each
    layer's ``num_points_scale`` (``1 / n`` for each of a level's ``n``
    sampling points, float32, as upstream builds it).

    Args:
        model (nn.Module): The port's detector (it has
            ``generate_anchors``).
        eval_size (tuple[int, int]): Upstream's ``eval_spatial_size``.
        layer_points (list[list[int]]): Sampling points per level of each
            decoder layer.
        log (callable): Receives one line per buffer.

    Returns:
        dict: Upstream key -> tensor.
    """
    levels = feature_level_shapes(model, eval_size)
    anchors, valid = model.generate_anchors(levels, torch.zeros(0))
    buffers = {'decoder.anchors': anchors, 'decoder.valid_mask': valid}
    for index, points in enumerate(layer_points):
        buffers[f'decoder.decoder.layers.{index}.cross_attn.'
                'num_points_scale'] = torch.tensor(
                    [1 / n for n in points for _ in range(n)],
                    dtype=torch.float32)
    for key, value in buffers.items():
        log(f'add   {key} {tuple(value.shape)} (derived, eval size '
            f'{eval_size[0]}x{eval_size[1]}, levels {levels})')
    return buffers


def split_mmengine_checkpoint(
        checkpoint: Dict
) -> Tuple[StateDict, Optional[StateDict], Optional[int]]:
    """The raw weights, the EMA weights and the EMA's update count of an
    MMEngine checkpoint.

    ``EMAHook.before_save_checkpoint`` swaps the two before saving, so that
    ``state_dict`` loads the averaged weights for testing: ``state_dict``
    then holds the EMA weights, and ``ema_state_dict`` the raw ones under
    ``module.`` with the averaged model's ``steps``. Without
    ``ema_state_dict`` (no EMA hook, or a file of ``tools/convert_*``),
    ``state_dict`` is the raw weights and there is no EMA.

    Args:
        checkpoint (dict): The loaded file (a plain state dict is taken as
            the raw weights).

    Returns:
        tuple: ``(raw, ema, steps)``; ``ema`` and ``steps`` are None
        without an EMA.

    Raises:
        CheckpointConversionError: no weights, or the EMA's keys differ
            from the model's.
    """
    state = checkpoint.get('state_dict')
    if state is None and checkpoint and all(
            isinstance(v, torch.Tensor) for v in checkpoint.values()):
        state = checkpoint
    if not isinstance(state, dict):
        raise CheckpointConversionError(
            'No weights found: expected an MMEngine checkpoint with '
            "'state_dict', but got top-level keys "
            f'{sorted(checkpoint)[:10]}.')
    state = {strip_module_prefix(k): v for k, v in state.items()}
    swapped = checkpoint.get('ema_state_dict')
    if swapped is None:
        return state, None, None
    raw = {
        k[len('module.'):]: v
        for k, v in swapped.items() if k.startswith('module.')
    }
    if set(raw) != set(state) or 'steps' not in swapped:
        raise CheckpointConversionError(
            "The checkpoint's ema_state_dict is not the layout EMAHook "
            "saves (its module.* keys are state_dict's, plus 'steps'): "
            f'keys in one only {sorted(set(raw) ^ set(state))[:5]}, steps '
            f"{'present' if 'steps' in swapped else 'missing'}.")
    return raw, state, int(swapped['steps'])


def convert_to_upstream_checkpoint(checkpoint: Dict,
                                   convert: Callable[[StateDict, Log],
                                                     StateDict],
                                   ema_fields: Optional[Dict] = None,
                                   log: Log = print) -> Dict:
    """An MMEngine checkpoint in the layout upstream's solvers save
    (RT-DETR's, D-FINE's, DEIM's and DEIMv2's ``BaseSolver.state_dict``),
    which their ``train.py -r`` / ``-t`` and
    ``tools/deployment/export_onnx.py`` read.

    ``model`` holds the raw weights; with an EMA, ``ema`` holds
    ``ModelEMA.state_dict()``: ``module`` (the EMA weights, which upstream
    evaluates, fine-tunes from and exports) and ``updates`` (the EMA's
    ``steps``: upstream's decay ramps up over them as ours). ``date`` is
    written as upstream does. Not written: ``last_epoch``, the optimizer,
    lr schedulers and grad scaler (their parameter groups are the port's),
    so ``-r`` starts upstream's schedule at epoch 0 from these weights.

    Args:
        checkpoint (dict): The loaded MMEngine checkpoint.
        convert (callable): ``convert(state, log)``: the port's state dict
            in upstream's names (a family's inverse key table).
        ema_fields (dict, optional): Further ``ModelEMA.state_dict()``
            entries of this upstream (RT-DETR v1: ``warmups``). Defaults
            to None.
        log (callable): Receives the mapping of ``model`` key by key and a
            line on each part. Defaults to ``print``.

    Returns:
        dict: The upstream checkpoint.
    """
    raw, ema, steps = split_mmengine_checkpoint(checkpoint)
    upstream = {'date': datetime.now().isoformat(), 'model': convert(raw, log)}
    if ema is None:
        log(f"model: {len(upstream['model'])} tensors from state_dict "
            '(no ema_state_dict: no EMA written)')
        return upstream
    module = convert(ema, lambda line: None)
    upstream['ema'] = dict(module=module, updates=steps, **(ema_fields or {}))
    log(f"model: {len(upstream['model'])} tensors, the raw weights "
        "(ema_state_dict's module.*); ema.module: the EMA weights "
        f"(state_dict), updates {steps}")
    return upstream


def convert_file_to_upstream(
        src: str,
        dst: str,
        config: str,
        converter: Callable[[Config, nn.Module],
                            Tuple[Callable[[StateDict, Log], StateDict],
                                  Optional[Dict]]],
        trust_pickle: bool = False,
        log: Log = print) -> None:
    """What ``tools/convert_*_checkpoint.py --to-upstream`` runs.

    Loads ``src`` (``torch.load(weights_only=True)`` unless
    ``trust_pickle``), builds the config's model on the meta device
    (structure and shapes, no memory), converts with
    :func:`convert_to_upstream_checkpoint` and saves to ``dst``.

    Args:
        src (str): Our checkpoint.
        dst (str): The upstream file to write.
        config (str): The config ``src`` was trained with.
        converter (callable): ``converter(cfg, model)`` returns the
            family's inverse bound to them, ``convert(state, log)``, and
            its further EMA fields (or None).
        trust_pickle (bool): Load ``src`` with ``weights_only=False``.
            Defaults to False.
        log (callable): Receives the progress lines. Defaults to
            ``print``.

    Raises:
        CheckpointConversionError: the file is refused or does not fit.
    """
    try:
        checkpoint = load_checkpoint_file(src, 'cpu',
                                          [src] if trust_pickle else None)
    except UnsafeCheckpointError as error:
        raise CheckpointConversionError(
            f'{error}\nHere: rerun with --trust-pickle.') from error
    cfg = Config.fromfile(config)
    model = build_reference_model(cfg, device='meta')
    convert, ema_fields = converter(cfg, model)
    upstream = convert_to_upstream_checkpoint(checkpoint, convert, ema_fields,
                                              log)
    save_upstream_checkpoint(upstream, dst, log)


def save_upstream_checkpoint(upstream: Dict, dst: str, log: Log) -> None:
    """Write an upstream checkpoint (plain tensors, ints and strings: it
    loads with ``torch.load(weights_only=True)``).

    Args:
        upstream (dict): From :func:`convert_to_upstream_checkpoint`.
        dst (str): Output path.
        log (callable): Receives the line saying what was saved.
    """
    torch.save(upstream, dst)
    log(f"saved {' and '.join(k for k in ('model', 'ema') if k in upstream)}"
        f' to {dst}')


def compare_state_dicts(expected: StateDict, actual: StateDict) -> List[str]:
    """Every way ``actual`` differs from ``expected``, for round-trip
    checks: keys missing or extra, and per shared key a dtype, shape or
    any bit that differs (``torch.equal`` would call ``-0.0`` and ``0.0``
    equal and a NaN unequal to itself).

    Args:
        expected (dict): The original state dict.
        actual (dict): The one that came back.

    Returns:
        list[str]: One line per difference, naming the key; empty when
        the two are identical.
    """
    problems = [f'missing: {k}' for k in expected if k not in actual]
    problems += [f'extra: {k}' for k in actual if k not in expected]
    for key in [k for k in expected if k in actual]:
        want, got = expected[key], actual[key]
        if want.dtype != got.dtype:
            problems.append(f'dtype: {key} {want.dtype} -> {got.dtype}')
        elif want.shape != got.shape:
            problems.append(f'shape: {key} {tuple(want.shape)} -> '
                            f'{tuple(got.shape)}')
        elif not torch.equal(_bits(want), _bits(got)):
            problems.append(f'values: {key}')
    return problems


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of ``tensor`` on the host, for a bitwise comparison."""
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
