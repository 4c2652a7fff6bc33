"""Real ``PackDetInputs`` items for the collate and hook tests."""
from typing import Dict, List, Sequence

import numpy as np
from torch.utils.data import Dataset

IMAGE_SIZE = 32


def packed_item(num_boxes: int,
                img_id: int = 0,
                with_annotations: bool = True) -> Dict:
    """What ``CocoDataset`` + ``PackDetInputs`` yield for one image.

    ``with_annotations=False`` packs a test-time sample (no
    ``LoadAnnotations``).
    """
    from mmdet.datasets.transforms import PackDetInputs
    from mmdet.structures.bbox import HorizontalBoxes
    rng = np.random.default_rng(img_id)
    results = dict(
        img=np.full((IMAGE_SIZE, IMAGE_SIZE, 3), img_id % 255, np.uint8),
        img_id=img_id,
        img_path=f'img{img_id}.png',
        ori_shape=(IMAGE_SIZE, IMAGE_SIZE),
        img_shape=(IMAGE_SIZE, IMAGE_SIZE),
        scale_factor=(1.0, 1.0),
        flip=False,
        flip_direction=None)
    if with_annotations:
        corners = rng.uniform(0, IMAGE_SIZE / 2, (num_boxes, 2))
        boxes = np.concatenate([corners, corners + 8], axis=1)
        results.update(
            gt_bboxes=HorizontalBoxes(boxes.astype(np.float32)),
            gt_bboxes_labels=rng.integers(0, 2, num_boxes),
            gt_ignore_flags=np.zeros(num_boxes, bool))
    return PackDetInputs()(results)


def packed_batch(gt_counts: Sequence[int], first_id: int = 0) -> List[Dict]:
    return [
        packed_item(count, first_id + i) for i, count in enumerate(gt_counts)
    ]


class PackedItemsDataset(Dataset):
    """Packed items whose GT counts follow ``gt_counts`` (picklable, so
    it works with spawned DataLoader workers)."""

    def __init__(self, gt_counts: Sequence[int]) -> None:
        self.gt_counts = list(gt_counts)

    def __len__(self) -> int:
        return len(self.gt_counts)

    def __getitem__(self, index: int) -> Dict:
        return packed_item(self.gt_counts[index], img_id=index)
