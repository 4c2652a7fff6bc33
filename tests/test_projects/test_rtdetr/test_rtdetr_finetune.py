"""Fine-tuning RT-DETR-tiny on ~50 %-empty synthetic data learns.

One process, MMEngine's Runner on configs/rtdetr_tiny.py: COCO bbox mAP
(pycocotools, CocoMetric) of the untrained model, then of the same model
after a few hundred iterations on the session's synthetic dataset (24
training images, about half of them without boxes).
"""
from ...helpers import data_overrides, tiny_overrides
from .rtdetr_utils import TINY_CONFIG, import_project

ITERS = 200
MAP_KEY = 'coco/bbox_mAP'


def test_finetuning_raises_map_well_above_untrained(synthetic_root, tmp_path):
    import_project()
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(TINY_CONFIG)
    cfg.merge_from_dict(data_overrides(synthetic_root))
    cfg.merge_from_dict(tiny_overrides(ITERS))
    cfg.merge_from_dict({
        'default_hooks.logger.interval': 50,
        'default_hooks.checkpoint': None,
    })
    cfg.work_dir = str(tmp_path)
    cfg.launcher = 'none'
    runner = RUNNERS.build(cfg)
    untrained = runner.val()[MAP_KEY]
    runner.train()
    trained = runner.val()[MAP_KEY]
    print(f'RT-DETR-tiny bbox mAP: untrained {untrained:.3f}, after '
          f'{ITERS} iterations {trained:.3f}')
    assert trained >= 0.1 + untrained, (untrained, trained)
    assert trained >= 3 * untrained, (untrained, trained)
