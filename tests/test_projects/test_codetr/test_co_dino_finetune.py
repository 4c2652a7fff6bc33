"""Fine-tuning CO-DINO-tiny on ~50 %-empty synthetic data learns.

One process, MMEngine's Runner on configs/co_dino_tiny.py: COCO bbox mAP
(pycocotools, CocoMetric, via Runner.val) of the untrained model, then of
the same model after training on the session's synthetic dataset (24
training images, about half of them without boxes). This is also the
inference check: the query head's predictions go through soft-NMS and
CocoMetric.
"""
from ...helpers import finetune_map
from .codetr_utils import TINY_CONFIG, import_project

ITERS = 60


def test_finetuning_raises_map_well_above_untrained(synthetic_root, tmp_path):
    import_project()
    untrained, trained = finetune_map(TINY_CONFIG, synthetic_root, ITERS,
                                      str(tmp_path))
    print(f'CO-DINO-tiny bbox mAP: untrained {untrained:.3f}, after '
          f'{ITERS} iterations {trained:.3f}')
    assert trained >= 0.1 + untrained, (untrained, trained)
    assert trained >= 3 * untrained, (untrained, trained)
