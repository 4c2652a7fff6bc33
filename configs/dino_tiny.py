# Tiny DINO on the generated synthetic dataset, with mmddp_ext switched on.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh configs/dino_tiny.py 2
_base_ = [
    './_base_/schedules/tiny_200iter.py',
    './_base_/datasets/synthetic_coco.py',
    './_base_/models/dino_tiny.py',
    './_base_/mmddp_ext.py',
]
