# Tiny CO-DINO (projects/CO-DETR) on the generated synthetic dataset, with
# the whole mmddp_ext stack switched on. The demo (tools/demo.sh) trains it.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh configs/co_dino_tiny.py 2
_base_ = [
    './_base_/schedules/tiny_200iter.py',
    './_base_/datasets/synthetic_coco.py',
    './_base_/models/co_dino_tiny.py',
    './_base_/mmddp_ext.py',
]
# Set here, not in a base: configs/_base_/mmddp_ext.py owns the key.
custom_imports = dict(
    imports=['mmddp_ext', 'projects.CO-DETR.codetr'],
    allow_failed_imports=False)
# The 128-d tiny model learns the synthetic shapes in fewer iterations with
# a larger lr than the schedule's 4e-4.
optim_wrapper = dict(optimizer=dict(lr=1e-3))
