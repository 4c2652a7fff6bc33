# Tiny RT-DETR (projects/RT-DETR) on the generated synthetic dataset, with
# mmddp_ext switched on.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh configs/rtdetr_tiny.py 2
_base_ = [
    './_base_/schedules/tiny_200iter.py',
    './_base_/datasets/synthetic_coco.py',
    './_base_/models/rtdetr_tiny.py',
    './_base_/mmddp_ext.py',
]
# The port's package; configs/_base_/mmddp_ext.py registers mmddp_ext itself
# and leaves custom_imports to the config.
custom_imports = dict(
    imports=['projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
# RT-DETR-tiny (64-d) learns the synthetic shapes faster with a larger lr.
optim_wrapper = dict(optimizer=dict(lr=1e-3))
