"""Fine-tuning RT-DETR-tiny on ~50 %-empty synthetic data learns.

One process, MMEngine's Runner on configs/rtdetr_tiny.py: COCO bbox mAP
(pycocotools, CocoMetric) of the initialised, untrained model, then of the
same model after 200 iterations on the session's synthetic dataset (24
training images, about half of them without boxes).

Deterministic (seed, sampler, algorithms, thread count). Measured on seeds
0, 1 and 2: untrained mAP 0.000, 0.001 and 0.000; trained mAP 0.367, 0.378
and 0.392 (mAP@50 0.618, 0.594, 0.767).
"""
import pytest

from ...helpers import finetune_map
from .rtdetr_utils import TINY_CONFIG, import_project

ITERS = 200
SEED = 0


# One process with 2 threads: with the suite's two pytest workers both
# learning tests can run at once and take 2-3x their time alone (131 s and
# 101 s against 59 s and 36 s in one measured run), more beside another
# training; this bounds a hang, not the speed.
@pytest.mark.timeout(900)
def test_finetuning_raises_map_well_above_untrained(synthetic_root, tmp_path):
    import_project()
    untrained, trained = finetune_map(TINY_CONFIG, synthetic_root, ITERS,
                                      str(tmp_path), seed=SEED)
    before, after = untrained['coco/bbox_mAP'], trained['coco/bbox_mAP']
    print(f'RT-DETR-tiny bbox mAP: untrained {before:.3f}, after '
          f'{ITERS} iterations {after:.3f}')
    assert after >= 0.1 + before, (untrained, trained)
    assert after >= 3 * before, (untrained, trained)
