# D-FINE-N shrunk for CPU tests and demos, on the generated synthetic data
# with mmddp_ext switched on: HGNetv2-B0 (stages 2-3, from scratch), a 64-d
# hybrid encoder and 3-layer decoder on 2 levels (2 and 3 sampling
# points), 30 queries, 10 dn queries, 96-px images. Same structure, losses
# and matcher as configs/_base_/dfine_hgnetv2_n.py.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py 2
_base_ = [
    '../../../configs/_base_/schedules/tiny_200iter.py',
    '../../../configs/_base_/datasets/synthetic_coco.py',
    './_base_/dfine_hgnetv2_n.py',
    '../../../configs/_base_/mmddp_ext.py',
]
embed_dims = 64
num_levels = 2
model = dict(
    num_queries=30,
    feat_channels=[embed_dims] * num_levels,
    data_preprocessor=dict(
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    backbone=dict(init_cfg=None),
    neck=dict(hidden_dim=embed_dims, num_heads=4, feedforward_channels=128),
    decoder=dict(
        layer_cfg=dict(
            embed_dims=embed_dims,
            num_heads=4,
            feedforward_channels=128,
            num_points=[2, 3])),
    bbox_head=dict(num_classes=2, embed_dims=embed_dims),
    dn_cfg=dict(group_cfg=dict(num_dn_queries=10)),
    test_cfg=dict(max_per_img=30))
# The tiny model learns the synthetic shapes faster with a larger lr.
optim_wrapper = dict(optimizer=dict(lr=1e-3))
