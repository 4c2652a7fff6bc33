"""Start-up check that every head predicts as many classes as the dataset.

A head with fewer classes than the dataset fails deep inside training
(``IndexError: index out of range in self`` in DINO's label embedding, a
device-side assert on GPU); one with more silently never learns the extra
classes. CO-DINO has ``num_classes`` in three heads, so a fine-tune that
edits one of them is a common mistake. These checks read the configs only,
before anything is built, and name every key to change.
"""
import inspect
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from mmengine.fileio import list_from_file

SPLITS = ('train', 'val', 'test')


def _get_type(registry_root, type_name: Any, scope: Optional[str]):
    """The class registered as ``type_name`` (a class is returned as is),
    or None when the registry does not know it."""
    if isinstance(type_name, type):
        return type_name
    if not isinstance(type_name, str):
        return None
    with registry_root.switch_scope_and_registry(scope) as registry:
        try:
            return registry.get(type_name)
        except KeyError:
            return None


def _init_parameter(cls: Optional[type], name: str):
    """The ``name`` parameter of the first ``__init__`` along ``cls``'s MRO
    that declares it, or None."""
    for klass in getattr(cls, '__mro__', ()):
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get(name)
        except (TypeError, ValueError):
            continue
        if parameter is not None:
            return parameter
    return None


def is_class_agnostic(head_type: Optional[type]) -> bool:
    """Whether ``head_type`` predicts one class by design (RPN-style heads).

    The first ``__init__`` along the MRO that names ``num_classes`` decides:
    a default of 1 marks a head that is built class-agnostic (``RPNHead``
    and its subclasses, ``GARPNHead``), whatever the dataset. Heads that
    predict the dataset's classes take ``num_classes`` without a default or
    with a dataset-sized one.
    """
    parameter = _init_parameter(head_type, 'num_classes')
    return parameter is not None and parameter.default == 1


def predicts_segmentation_maps(head_type: Optional[type]) -> bool:
    """Whether ``head_type`` is a semantic-segmentation head (its
    constructor takes ``loss_seg``): its classes are those of the
    segmentation maps (HTC's 183 COCO-stuff classes), not the dataset's
    instance classes."""
    return _init_parameter(head_type, 'loss_seg') is not None


def num_classes_keys(model: Any,
                     scope: Optional[str] = None,
                     prefix: str = 'model') -> List[Tuple[str, int]]:
    """``(config key, value)`` of every ``num_classes`` in the model config
    ``model``, in nested dicts and lists (``model.roi_head[0].bbox_head.
    num_classes``), leaving out heads whose classes are not the dataset's
    instance classes (:func:`is_class_agnostic`,
    :func:`predicts_segmentation_maps`)."""
    from mmengine.registry import MODELS
    found = []
    if isinstance(model, Mapping):
        value = model.get('num_classes')
        if isinstance(value, int) and not isinstance(value, bool):
            head_type = _get_type(MODELS, model.get('type'), scope)
            if not (is_class_agnostic(head_type)
                    or predicts_segmentation_maps(head_type)):
                found.append((f'{prefix}.num_classes', value))
        for key, child in model.items():
            found += num_classes_keys(child, scope, f'{prefix}.{key}')
    elif isinstance(model, (list, tuple)):
        for index, child in enumerate(model):
            found += num_classes_keys(child, scope, f'{prefix}[{index}]')
    return found


def _not_comparable(model_type: Optional[type]) -> Optional[str]:
    """Why the heads of ``model_type`` do not predict a fixed set of
    dataset classes, or None when they do (or the type is unknown)."""
    from mmdet.models.detectors import BaseDetector
    if model_type is None:
        return None
    if not issubclass(model_type, BaseDetector):
        return (f'{model_type.__name__} is not a detector (mmdet '
                'BaseDetector); e.g. a tracker filters its dataset\'s '
                'categories itself')
    if _init_parameter(model_type, 'language_model') is not None:
        return (f'{model_type.__name__} takes a language_model: it '
                'classifies by text prompts, not a fixed class list')
    return None


def _forced_single_class_keys(model_type: Optional[type]) -> Tuple[str, ...]:
    """Keys the detector itself sets to one class: TwoStageDetector (and
    every subclass) overrides ``rpn_head.num_classes`` with 1, whatever
    head type sits there (``FCOSHead`` as RPN, for example)."""
    from mmdet.models.detectors import TwoStageDetector
    if model_type is not None and issubclass(model_type, TwoStageDetector):
        return ('model.rpn_head.num_classes', )
    return ()


def _classes_from_metainfo(metainfo: Any) -> Optional[Tuple[str, ...]]:
    """The instance classes of ``metainfo``: ``thing_classes`` where the
    dataset also has stuff classes (panoptic), else ``classes``."""
    if not isinstance(metainfo, Mapping):
        return None
    classes = metainfo.get('thing_classes', metainfo.get('classes'))
    if isinstance(classes, str):
        # BaseDataset reads a string as a file with one class per line.
        try:
            classes = list_from_file(classes)
        except OSError:
            return None
    return tuple(classes) if classes is not None else None


def dataset_classes(
        dataset: Any, key: str,
        scope: Optional[str]) -> Iterator[Tuple[str, Tuple[str, ...]]]:
    """``(where, classes)`` of every dataset inside ``dataset`` (a config
    or a built dataset). Wrappers (``RepeatDataset``, ``ConcatDataset``,
    ``ClassBalancedDataset``, ...) are looked through via their ``dataset``
    / ``datasets`` keys. A dataset's classes are ``metainfo.classes`` in
    its config, else its type's ``METAINFO``."""
    from mmengine.registry import DATASETS
    if not isinstance(dataset, Mapping):
        classes = _classes_from_metainfo(getattr(dataset, 'metainfo', None))
        if classes is not None:
            yield key, classes
        return
    children = dataset.get('datasets')
    if isinstance(children, (list, tuple)):
        for index, child in enumerate(children):
            yield from dataset_classes(child, f'{key}.datasets[{index}]',
                                       scope)
        return
    if dataset.get('dataset') is not None:
        yield from dataset_classes(dataset['dataset'], f'{key}.dataset', scope)
        return
    classes = _classes_from_metainfo(dataset.get('metainfo'))
    if classes is not None:
        yield f'{key}.metainfo.classes', classes
        return
    dataset_type = _get_type(DATASETS, dataset.get('type'), scope)
    classes = _classes_from_metainfo(getattr(dataset_type, 'METAINFO', None))
    if classes is not None:
        yield f'{key} ({dataset_type.__name__}.METAINFO)', classes


def _option_key(key: str) -> str:
    """``model.roi_head[0].x`` spelled as --cfg-options expects it."""
    return key.replace('[', '.').replace(']', '')


def check_class_counts(model: Any,
                       dataloaders: Mapping[str, Any],
                       scope: Optional[str] = None) -> None:
    """Raise ``ValueError`` if a head's ``num_classes`` differs from the
    number of classes of a dataset it trains or evaluates on.

    Args:
        model (dict): The model config (a built model is not checked).
        dataloaders (Mapping[str, Any]): Dataloader configs or built
            dataloaders by config key (``'train_dataloader'``, ...); None
            entries are skipped.
        scope (str, optional): Registry scope of the config
            (``default_scope``) for looking up dataset and head types.
            Defaults to None (the current default scope).
    """
    from mmengine.logging import print_log
    from mmengine.registry import MODELS
    if not isinstance(model, Mapping):
        return
    model_type = _get_type(MODELS, model.get('type'), scope)
    reason = _not_comparable(model_type)
    if reason is not None:
        print_log(f'Class-count check skipped: {reason}.', logger='current')
        return
    forced = _forced_single_class_keys(model_type)
    heads = [(key, value) for key, value in num_classes_keys(model, scope)
             if key not in forced]
    if not heads:
        return
    by_count: Dict[int, List[str]] = {}
    for name, loader in dataloaders.items():
        dataset = (
            loader.get('dataset') if isinstance(loader, Mapping) else getattr(
                loader, 'dataset', None))
        if dataset is None:
            continue
        for where, classes in dataset_classes(dataset, f'{name}.dataset',
                                              scope):
            by_count.setdefault(len(classes),
                                []).append(f'{where} = {classes!r}')
    problems = []
    for count, sources in by_count.items():
        wrong = [(key, value) for key, value in heads if value != count]
        if wrong:
            problems.append((count, sources, wrong))
    if not problems:
        return
    lines = []
    for count, sources, wrong in problems:
        lines.append(f'the dataset has {count} classes ('
                     f'{"; ".join(sources)}), but ' +
                     ', '.join(f'{key}={value}' for key, value in wrong))
    count, _, wrong = problems[0]
    options = ' '.join(f'{_option_key(key)}={count}' for key, _ in wrong)
    raise ValueError(
        'Class count mismatch between the model and the dataset: ' +
        '; '.join(lines) + '. A head with fewer classes than the dataset '
        'fails inside training (IndexError: index out of range, or a CUDA '
        'device-side assert); one with more never learns the extra classes. '
        'Set every listed num_classes to the number of dataset classes '
        f'(e.g. --cfg-options {options}), or set metainfo=dict(classes=...) '
        'in the dataset config to the classes the model is meant for.')


def check_config_class_counts(cfg: Any,
                              splits: Tuple[str, ...] = SPLITS) -> None:
    """Run :func:`check_class_counts` on ``cfg.model`` and the dataloaders
    of ``splits`` (all three by default; tools/test.py checks only
    'test')."""
    check_class_counts(
        cfg.get('model'), {
            f'{split}_dataloader': cfg.get(f'{split}_dataloader')
            for split in splits
        },
        scope=cfg.get('default_scope'))
