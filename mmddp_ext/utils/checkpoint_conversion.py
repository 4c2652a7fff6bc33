"""What converting an upstream checkpoint to a port's names takes besides
the key table: loading the file safely, dropping a DDP ``module.``
prefix, filling the BN counters frozen layers do not store, checking the
result against a config's model and saving it for ``load_from``.

The key tables live with the ports they serve (``projects/<Name>/``);
``tools/convert_*_checkpoint.py`` are their command lines.
"""
import pickle
from typing import Callable, Dict, List, Optional

import torch
import torch.nn as nn
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.utils import import_modules_from_strings

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


def build_reference_model(config: str,
                          backbone_only: bool = False) -> nn.Module:
    """The model that ``config`` builds (random weights), or its backbone,
    to check a conversion against.

    Args:
        config (str): Path of a model config; its ``custom_imports`` are
            imported first.
        backbone_only (bool): Build ``model.backbone`` alone. Defaults to
            False.

    Returns:
        nn.Module: The model or backbone.
    """
    cfg = Config.fromfile(config)
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope('mmdet')
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
