"""Early, readable checks of COCO annotation files named in a config.

pycocotools reports a broken file deep inside dataset building with a bare
``JSONDecodeError`` or ``KeyError``; these checks run before the runner is
built and name the file and the problem.
"""
import json
import os.path as osp
from typing import Any, Iterator, List, Sequence, Tuple

MAX_REPORTED = 5
SPLITS = ('train', 'val', 'test')


def _problems(data: Any) -> List[str]:
    if not isinstance(data, dict):
        return [f'the top level is a {type(data).__name__}, not an object '
                'with images/annotations/categories']
    problems = []
    for key in ('images', 'annotations', 'categories'):
        if not isinstance(data.get(key), list):
            problems.append(f'"{key}" is missing or not a list')
    if problems:
        return problems
    image_ids = set()
    for i, image in enumerate(data['images']):
        if not isinstance(image, dict) or not {'id', 'file_name'} <= set(
                image):
            problems.append(f'images[{i}] lacks "id" or "file_name"')
        else:
            image_ids.add(image['id'])
    category_ids = {
        c.get('id')
        for c in data['categories'] if isinstance(c, dict)
    }
    for i, ann in enumerate(data['annotations']):
        if not isinstance(ann, dict):
            problems.append(f'annotations[{i}] is not an object')
            continue
        bbox = ann.get('bbox')
        if (not isinstance(bbox, list) or len(bbox) != 4
                or not all(isinstance(v, (int, float)) for v in bbox)):
            problems.append(f'annotations[{i}].bbox is {bbox!r}, expected '
                            '[x, y, width, height] numbers')
        elif bbox[2] < 0 or bbox[3] < 0:
            problems.append(f'annotations[{i}].bbox {bbox} has a negative '
                            'width or height')
        if ann.get('image_id') not in image_ids:
            problems.append(f'annotations[{i}].image_id '
                            f'{ann.get("image_id")!r} is not an image id')
        if ann.get('category_id') not in category_ids:
            problems.append(f'annotations[{i}].category_id '
                            f'{ann.get("category_id")!r} is not a category id')
        if len(problems) >= MAX_REPORTED:
            break
    return problems


def check_coco_file(path: str) -> None:
    """Raise ``ValueError`` naming ``path`` and the problem if it is not a
    usable COCO detection annotation file."""
    if not osp.isfile(path):
        raise ValueError(f'annotation file {path} does not exist; check '
                         'data_root and ann_file in the dataset config.')
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(
            f'annotation file {path} is not valid JSON: {error.msg} at line '
            f'{error.lineno}, column {error.colno}.') from error
    except UnicodeDecodeError as error:
        raise ValueError(
            f'annotation file {path} is not UTF-8 text ({error}); is it '
            'really a COCO JSON file?') from error
    problems = _problems(data)
    if problems:
        raise ValueError(f'annotation file {path} is not valid COCO: ' +
                         '; '.join(problems[:MAX_REPORTED]) + '.')


def _dataset_ann_files(dataset_cfg: Any) -> Iterator[str]:
    if not isinstance(dataset_cfg, dict):
        return
    for child in ('dataset', 'datasets'):
        nested = dataset_cfg.get(child)
        for sub in nested if isinstance(nested, list) else [nested]:
            yield from _dataset_ann_files(sub)
    ann_file = dataset_cfg.get('ann_file')
    if isinstance(ann_file, str) and ann_file:
        root = dataset_cfg.get('data_root') or ''
        yield ann_file if osp.isabs(ann_file) else osp.join(root, ann_file)


def config_ann_files(
    cfg: Any,
    splits: Sequence[str] = SPLITS,
) -> List[Tuple[str, str]]:
    """``(config key, path)`` of every JSON annotation file in ``cfg``'s
    dataloaders and evaluators of ``splits`` ('train', 'val', 'test')."""
    found = []
    for split in splits:
        loader = cfg.get(f'{split}_dataloader') or {}
        for path in _dataset_ann_files(loader.get('dataset')):
            found.append((f'{split}_dataloader.dataset.ann_file', path))
        evaluators = cfg.get(f'{split}_evaluator') or []
        for evaluator in (evaluators if isinstance(evaluators, list) else
                          [evaluators]):
            path = evaluator.get('ann_file') if isinstance(evaluator,
                                                           dict) else None
            if isinstance(path, str):
                found.append((f'{split}_evaluator.ann_file', path))
    return [(key, path) for key, path in found if path.endswith('.json')]


def check_config_annotations(cfg: Any,
                             splits: Sequence[str] = SPLITS) -> None:
    """Run :func:`check_coco_file` on every annotation file that ``cfg``
    uses for ``splits`` (all three by default; tools/test.py checks only
    'test')."""
    for key, path in dict.fromkeys(config_ann_files(cfg, splits)):
        try:
            check_coco_file(path)
        except ValueError as error:
            raise ValueError(f'{key}: {error}') from None
