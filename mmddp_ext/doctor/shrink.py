"""``--shrink``: smaller images and batches, the same architecture.

Every image-size setting of the pipelines (``scale``, ``scales``,
``crop_size``, ``img_scale`` of any transform) and of the model's batch
augments (CrowdDet's ``BatchResize`` ``scale``, YOLOX's
``BatchSyncRandomResize`` ``random_size_range``) is scaled down so that
its shorter side is at most ``short_side``, keeping the aspect ratio (a
``(400, 4200)`` resize, which means "short side 400, long side nearly
free", becomes ``(128, 1344)``), and the train batch size is capped.
Pixel offsets from the size of the image a transform receives
(``border`` of ``RandomAffine`` and ``RandomCenterCropPad``) are scaled
by the factor that shrank their dataloader's largest images, so that
YOLOX's ``border=(-320, -320)`` after a 640-px ``Mosaic`` becomes
``(-32, -32)`` after a 64-px one instead of cutting the whole image away.
Layers, queries and losses stay as they are, so the graph, the loss keys
and the collectives are those of the full model.
"""
from typing import Any, List

SIZE_KEYS = ('scale', 'scales', 'crop_size', 'img_scale', 'random_size_range')
OFFSET_KEYS = ('border', )
SHORT_SIDE = 128
MAX_BATCH = 2


def _is_size(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and v > 0 for v in value)


def _shrink_size(value: Any, short_side: int) -> Any:
    if _is_size(value):
        factor = min(1.0, short_side / min(value))
        return type(value)(max(1, int(v * factor)) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value)(_shrink_size(v, short_side) for v in value)
    return value


def _size_factors(node: Any, short_side: int) -> List[float]:
    """The factor :func:`_shrink_size` applies to each size under node."""
    if isinstance(node, dict):
        return [
            factor for key, value in node.items()
            for factor in (_factors_of_size(value, short_side) if key in
                           SIZE_KEYS else _size_factors(value, short_side))
        ]
    if isinstance(node, (list, tuple)):
        return [f for v in node for f in _size_factors(v, short_side)]
    return []


def _factors_of_size(value: Any, short_side: int) -> List[float]:
    if _is_size(value):
        return [min(1.0, short_side / min(value))]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _factors_of_size(v, short_side)]
    return []


def _scale_offset(value: Any, factor: float) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_scale_offset(v, factor) for v in value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return type(value)(round(value * factor))
    return value


def _shrink_value(key: str, value: Any, short_side: int, factor: float) -> Any:
    if key in SIZE_KEYS:
        return _shrink_size(value, short_side)
    if key in OFFSET_KEYS:
        return _scale_offset(value, factor)
    return _shrink_node(value, short_side, factor)


def _shrink_node(node: Any, short_side: int, factor: float = 1.0) -> Any:
    if isinstance(node, dict):
        return type(node)({
            key: _shrink_value(key, value, short_side, factor)
            for key, value in node.items()
        })
    if isinstance(node, list):
        return [_shrink_node(v, short_side, factor) for v in node]
    return node


def shrink_config(cfg, short_side: int = SHORT_SIDE,
                  max_batch: int = MAX_BATCH) -> None:
    """Shrink ``cfg``'s dataloader pipelines, the model's batch augments
    and the train batch in place."""
    for split in ('train', 'val', 'test'):
        key = f'{split}_dataloader'
        if cfg.get(key):
            factor = min(_size_factors(cfg[key], short_side), default=1.0)
            cfg[key] = _shrink_node(cfg[key], short_side, factor)
    preprocessor = (cfg.get('model') or {}).get('data_preprocessor')
    if preprocessor:
        cfg.model.data_preprocessor = _shrink_node(preprocessor, short_side)
    loader = cfg.get('train_dataloader')
    if loader:
        loader['batch_size'] = min(loader.get('batch_size', 1), max_batch)
        loader['num_workers'] = 0
        loader['persistent_workers'] = False
