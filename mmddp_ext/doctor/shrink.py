"""``--shrink``: smaller images and batches, the same architecture.

Every image-size setting of the pipelines and of the data preprocessor's
batch augments (``scale``, ``scales``, ``crop_size``, ``img_scale``,
``size`` of any transform; ``random_size_range`` of YOLOX's
``BatchSyncRandomResize``; CrowdDet's ``BatchResize`` ``scale``; ``size``
of ``BatchFixedSizePad``; the square sides RT-DETR's ``BatchChoiceResize``
chooses from, by one factor) is scaled down so that its shorter side is at
most ``short_side``, keeping the aspect ratio (a ``(400, 4200)`` resize,
which means "short side 400, long side nearly free", becomes ``(128,
1344)``), the train batch size is capped, and so is every query count of
the model (``num_queries``, ``num_query``), to 50: two-stage DETRs pick
their queries among the encoder tokens, and a 128-pixel image gives as few
as 80 (D-FINE-N and DEIM-N use strides 16 and 32 only; three- and
four-level encoders give about 340). Pixel offsets from the size of the
image a transform receives (``border`` of ``RandomAffine`` and
``RandomCenterCropPad``) are scaled by the factor that shrank their
dataloader's largest images, so that YOLOX's ``border=(-320, -320)`` after
a 640-px ``Mosaic`` becomes ``(-32, -32)`` after a 64-px one instead of
cutting the whole image away. Layers, parameters and losses stay as they
are, so the graph, the loss keys and the collectives are those of the full
model."""
from typing import Any, List

SIZE_KEYS = ('scale', 'scales', 'crop_size', 'img_scale', 'size',
             'random_size_range')
OFFSET_KEYS = ('border', )
QUERY_KEYS = ('num_queries', 'num_query')
SHORT_SIDE = 128
MAX_BATCH = 2
MAX_QUERIES = 50


def _is_size(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, int) and v > 0 for v in value)


def _is_side_list(value: Any) -> bool:
    """A list of square sides to choose from (RT-DETR's multi-scale
    ``scales=[480, 512, ..., 800]``): more than two positive ints."""
    return isinstance(value, (list, tuple)) and len(value) > 2 and all(
        isinstance(v, int) and v > 0 for v in value)


# Largest power-of-two multiple a shrunk size keeps (a ViT's patch size,
# a backbone's last stride).
MAX_STEP = 32


def _step(value) -> int:
    """The largest power of two up to ``MAX_STEP`` dividing every size of
    ``value``: the divisibility the config's sizes have."""
    step = MAX_STEP
    while step > 1 and any(v % step for v in value):
        step //= 2
    return step


def _shrink_size(value: Any, short_side: int) -> Any:
    if _is_size(value) or _is_side_list(value):
        # One factor for the whole pair or list: the aspect ratio, or the
        # spread of the choices, stays; a list of square sides also keeps
        # its divisibility (DEIMv2's multi-scale sides are multiples of 32,
        # as its DINOv3 backbone needs multiples of 16: 680 x 128 / 480
        # would be 181).
        factor = min(1.0, short_side / min(value))
        step = _step(value) if factor < 1.0 and _is_side_list(value) else 1
        return type(value)(
            max(step, round(v * factor / step) * step) if step > 1 else
            max(1, int(v * factor)) for v in value)
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
    if _is_size(value) or _is_side_list(value):
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


def _cap_queries(node: Any, max_queries: int) -> Any:
    if isinstance(node, dict):
        return type(node)({
            key: (min(value, max_queries) if key in QUERY_KEYS
                  and isinstance(value, int) else _cap_queries(
                      value, max_queries))
            for key, value in node.items()
        })
    if isinstance(node, list):
        return [_cap_queries(v, max_queries) for v in node]
    return node


def shrink_config(cfg,
                  short_side: int = SHORT_SIDE,
                  max_batch: int = MAX_BATCH,
                  max_queries: int = MAX_QUERIES) -> None:
    """Shrink ``cfg``'s dataloader pipelines, batch augments, train batch
    and query counts in place."""
    for split in ('train', 'val', 'test'):
        key = f'{split}_dataloader'
        if cfg.get(key):
            factor = min(_size_factors(cfg[key], short_side), default=1.0)
            cfg[key] = _shrink_node(cfg[key], short_side, factor)
    if cfg.get('model'):
        cfg.model = _cap_queries(cfg.model, max_queries)
        if cfg.model.get('data_preprocessor'):
            cfg.model.data_preprocessor = _shrink_node(
                cfg.model.data_preprocessor, short_side)
    loader = cfg.get('train_dataloader')
    if loader:
        loader['batch_size'] = min(loader.get('batch_size', 1), max_batch)
        loader['num_workers'] = 0
        loader['persistent_workers'] = False
