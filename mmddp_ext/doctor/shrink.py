"""``--shrink``: smaller images and batches, the same architecture.

Every image-size setting of the pipelines and of the data preprocessor's
batch augments (``scale``, ``scales``, ``crop_size``, ``img_scale``,
``size`` of any transform; ``random_size_range`` of
``BatchSyncRandomResize``; ``size`` of ``BatchFixedSizePad``) is scaled
down so that its shorter side is at most ``short_side``, keeping the
aspect ratio (a ``(400, 4200)`` resize, which means "short side 400, long
side nearly free", becomes ``(128, 1344)``), the train batch size is
capped, and so is every query count of the model (``num_queries``,
``num_query``: a 128-pixel image has a few hundred encoder tokens, among
which two-stage DETRs pick their queries). Layers, parameters and losses
stay as they are, so the graph, the loss keys and the collectives are
those of the full model.
"""
from typing import Any

SIZE_KEYS = ('scale', 'scales', 'crop_size', 'img_scale', 'size',
             'random_size_range')
QUERY_KEYS = ('num_queries', 'num_query')
SHORT_SIDE = 128
MAX_BATCH = 2
MAX_QUERIES = 100


def _shrink_size(value: Any, short_side: int) -> Any:
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, int) for v in value) and len(value) == 2:
        factor = min(1.0, short_side / min(value))
        return type(value)(max(1, int(v * factor)) for v in value)
    if isinstance(value, (list, tuple)):
        return type(value)(_shrink_size(v, short_side) for v in value)
    return value


def _shrink_node(node: Any, short_side: int) -> Any:
    if isinstance(node, dict):
        return type(node)({
            key: (_shrink_size(value, short_side)
                  if key in SIZE_KEYS else _shrink_node(value, short_side))
            for key, value in node.items()
        })
    if isinstance(node, list):
        return [_shrink_node(v, short_side) for v in node]
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
            cfg[key] = _shrink_node(cfg[key], short_side)
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
