"""Static dataset checks: the annotation files the config names, read
directly (nothing is built)."""
import json
import math
import os.path as osp
from typing import Dict, List, Optional, Tuple

from ..utils.coco_check import check_coco_file, config_ann_files
from .report import BLOCKER, OK, WARN, Check

PHASE = 'dataset'
IMAGES_SAMPLED = 8


def _load(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def _split_files(cfg) -> Dict[str, List[Tuple[str, str]]]:
    """Annotation files of each split's dataloader (not evaluators)."""
    found: Dict[str, List[Tuple[str, str]]] = {}
    for key, path in config_ann_files(cfg):
        if key.endswith('dataloader.dataset.ann_file'):
            found.setdefault(key.split('_')[0], []).append((key, path))
    return found


def check_annotations(files: Dict[str, List[Tuple[str, str]]]
                      ) -> Tuple[Check, Dict[str, dict]]:
    problems, loaded = [], {}
    for pairs in files.values():
        for key, path in pairs:
            if path in loaded:
                continue
            try:
                check_coco_file(path)
                loaded[path] = _load(path)
            except ValueError as error:
                problems.append(f'{key}: {error}')
    if problems:
        return Check(
            PHASE, 'annotation files', BLOCKER, ' '.join(problems),
            on_gpus='every rank fails while building the dataset.',
            fix=['# fix the file, or data_root / ann_file in the config']
        ), loaded
    if not loaded:
        return Check(PHASE, 'annotation files', WARN,
                     'no COCO JSON annotation file in the dataloaders; '
                     'dataset checks skipped'), loaded
    return Check(PHASE, 'annotation files', OK,
                 f'{len(loaded)} valid COCO file(s)'), loaded


def _images_with_boxes(data: dict) -> set:
    return {a['image_id'] for a in data['annotations']
            if not a.get('iscrowd', 0)}


def check_empty_share(files, loaded) -> Check:
    shares, details = [], {}
    for split, pairs in files.items():
        for _, path in pairs:
            if path not in loaded:
                continue
            data = loaded[path]
            total = len(data['images'])
            empty = total - len(_images_with_boxes(data))
            share = empty / total if total else 1.0
            details[split] = dict(images=total, without_gt=empty,
                                  share=round(share, 4))
            shares.append(f'{split} {share:.0%} ({empty}/{total})')
    train = details.get('train')
    if train and train['without_gt'] == train['images']:
        key, path = files['train'][0]
        return Check(
            PHASE, 'images without GT', BLOCKER,
            f'no training image has a box ({path}): ' + ', '.join(shares),
            on_gpus='nothing to learn from.',
            fix=[f"{key.rsplit('.', 1)[0]}.ann_file='<a file with boxes>'"
                 '  # --cfg-options; or check its category ids against '
                 'metainfo.classes'],
            details=details)
    return Check(
        PHASE, 'images without GT', OK,
        'share of images without boxes: ' + ', '.join(shares) +
        ' (the dynamic checks show whether a GT-less batch is safe)',
        details=details)


def check_degenerate(loaded) -> Check:
    tiny, outside, total = [], [], 0
    for path, data in loaded.items():
        sizes = {i['id']: (i.get('width'), i.get('height'))
                 for i in data['images']}
        for ann in data['annotations']:
            total += 1
            x, y, w, h = ann['bbox']
            if w < 1 or h < 1:
                tiny.append(f"{osp.basename(path)} annotation {ann.get('id')}"
                            f' {ann["bbox"]}')
                continue
            width, height = sizes.get(ann['image_id'], (None, None))
            if width and height and (x < 0 or y < 0 or x + w > width + 1
                                     or y + h > height + 1):
                outside.append(f"{osp.basename(path)} annotation "
                               f"{ann.get('id')} {ann['bbox']}")
    if not tiny and not outside:
        return Check(PHASE, 'degenerate boxes', OK,
                     f'{total} boxes, none thinner than 1 px or outside '
                     'its image')
    parts = []
    if tiny:
        parts.append(f'{len(tiny)} box(es) thinner than 1 px, which '
                     f'MMDet drops silently (e.g. {tiny[0]}); an image '
                     'left without boxes then trains as background')
    if outside:
        parts.append(f'{len(outside)} box(es) reach outside their image '
                     f'(e.g. {outside[0]})')
    fix = []
    if tiny:
        fix.append('train_dataloader = dict(dataset=dict(filter_cfg=dict('
                   'filter_empty_gt=True)))  # skip the images the dropped '
                   'boxes leave without any')
    if outside:
        fix.append('# clip them in the annotation file: 0 <= x, 0 <= y, '
                   'x + w <= width, y + h <= height')
    return Check(PHASE, 'degenerate boxes', WARN, '; '.join(parts),
                 on_gpus='trains; the boxes are dropped or clipped.',
                 fix=fix,
                 details=dict(thin=tiny[:20], outside=outside[:20]))


def check_class_counts(cfg) -> Check:
    from ..utils.class_count_check import check_class_counts as check
    try:
        check(cfg.get('model'), {
            f'{s}_dataloader': cfg.get(f'{s}_dataloader')
            for s in ('train', 'val', 'test')
        }, scope=cfg.get('default_scope'))
    except ValueError as error:
        return Check(
            PHASE, 'classes vs num_classes', BLOCKER, str(error),
            on_gpus='IndexError (a device-side assert on GPU) in the first '
            'iteration with a label beyond num_classes; ExtRunner stops '
            'every rank at start-up with this message.',
            fix=_num_classes_fix(cfg))
    return Check(PHASE, 'classes vs num_classes', OK,
                 'every num_classes in the model matches the dataset')


def _num_classes_fix(cfg) -> List[str]:
    """``--cfg-options`` that set every head's ``num_classes`` to the train
    dataset's class count."""
    from ..utils.class_count_check import dataset_classes, num_classes_keys
    scope = cfg.get('default_scope')
    loader = cfg.get('train_dataloader') or {}
    found = list(dataset_classes(loader.get('dataset'),
                                 'train_dataloader.dataset', scope))
    if not found:
        return []
    count = len(found[0][1])
    options = ' '.join(
        f"{key.replace('[', '.').replace(']', '')}={count}"
        for key, value in num_classes_keys(cfg.get('model'), scope)
        if value != count)
    return [f'--cfg-options {options}  # or set metainfo=dict(classes=...) '
            'to the classes the model is meant for']


def _image_dir(cfg) -> Optional[str]:
    dataset = (cfg.get('train_dataloader') or {}).get('dataset') or {}
    while 'dataset' in dataset and 'ann_file' not in dataset:
        dataset = dataset['dataset']
    prefix = (dataset.get('data_prefix') or {}).get('img', '')
    return osp.join(dataset.get('data_root') or '', prefix)


def check_images(cfg, files, loaded) -> Check:
    import cv2
    pairs = files.get('train') or []
    if not pairs or pairs[0][1] not in loaded:
        return Check(PHASE, 'image files', WARN, 'no train annotation file')
    images = loaded[pairs[0][1]]['images']
    step = max(1, len(images) // IMAGES_SAMPLED)
    sample = images[::step][:IMAGES_SAMPLED]
    root = _image_dir(cfg)
    broken = [osp.join(root, i['file_name']) for i in sample
              if cv2.imread(osp.join(root, i['file_name'])) is None]
    if broken:
        return Check(
            PHASE, 'image files', BLOCKER,
            f'{len(broken)} of {len(sample)} sampled train images cannot be '
            f'read, e.g. {broken[0]}',
            on_gpus='the dataloader fails on the first such image.',
            fix=['train_dataloader = dict(dataset=dict(data_root='
                 "'<dataset root>/', data_prefix=dict(img='<images folder>/'"
                 '))) # the files are read from data_root + data_prefix.img'
                 ' + file_name'])
    return Check(PHASE, 'image files', OK,
                 f'{len(sample)} sampled train images read under {root}')


def check_images_per_rank(cfg, nproc: int, files, loaded) -> Check:
    loader = cfg.get('train_dataloader') or {}
    pairs = files.get('train') or []
    if not pairs or pairs[0][1] not in loaded:
        return Check(PHASE, 'images per rank', WARN,
                     'no train annotation file')
    data = loaded[pairs[0][1]]
    dataset = loader.get('dataset') or {}
    filter_cfg = dataset.get('filter_cfg') or {}
    count = (len(_images_with_boxes(data)) if filter_cfg.get(
        'filter_empty_gt') else len(data['images']))
    batch = loader.get('batch_size', 1)
    drop_last = bool(loader.get('drop_last', False))
    per_rank = math.ceil(count / nproc)
    last = per_rank % batch
    batches = per_rank // batch if drop_last else math.ceil(per_rank / batch)
    details = dict(images=count, per_rank=per_rank, batch_size=batch,
                   batches_per_rank=batches, drop_last=drop_last,
                   last_batch=last or batch)
    summary = (f'{count} training images: {per_rank} per rank, '
               f'{batches} batch(es) of {batch} per rank and epoch')
    if batches == 0:
        return Check(
            PHASE, 'images per rank', BLOCKER,
            summary + f' (drop_last=True and fewer than {batch} images per '
            'rank)', on_gpus='an epoch has no iteration.',
            fix=[f'train_dataloader = dict(batch_size={max(1, per_rank)})'],
            details=details)
    notes = []
    if count % nproc:
        notes.append(f'the sampler repeats {nproc - count % nproc} '
                     'image(s) to give every rank as many')
    if last and not drop_last:
        notes.append(f'the last batch of each epoch holds {last} image(s)')
    return Check(PHASE, 'images per rank', OK,
                 summary + ('; ' + '; '.join(notes) if notes else ''),
                 details=details)


def dataset_checks(cfg, nproc: int) -> List[Check]:
    files = _split_files(cfg)
    annotations, loaded = check_annotations(files)
    checks = [annotations, check_class_counts(cfg)]
    if loaded:
        checks += [
            check_empty_share(files, loaded),
            check_degenerate(loaded),
            check_images(cfg, files, loaded),
            check_images_per_rank(cfg, nproc, files, loaded),
        ]
    return checks
