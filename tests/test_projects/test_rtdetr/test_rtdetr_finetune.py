"""Fine-tuning RT-DETR-tiny on ~50 %-empty synthetic data learns.

One process, MMEngine's Runner on configs/rtdetr_tiny.py: COCO bbox mAP
(pycocotools, CocoMetric) of the untrained model, then of the same model
after a few hundred iterations on the session's synthetic dataset (24
training images, about half of them without boxes).
"""
from ...helpers import finetune_map
from .rtdetr_utils import TINY_CONFIG, import_project

ITERS = 200


def test_finetuning_raises_map_well_above_untrained(synthetic_root, tmp_path):
    import_project()
    untrained, trained = finetune_map(TINY_CONFIG, synthetic_root, ITERS,
                                      str(tmp_path))
    print(f'RT-DETR-tiny bbox mAP: untrained {untrained:.3f}, after '
          f'{ITERS} iterations {trained:.3f}')
    assert trained >= 0.1 + untrained, (untrained, trained)
    assert trained >= 3 * untrained, (untrained, trained)
