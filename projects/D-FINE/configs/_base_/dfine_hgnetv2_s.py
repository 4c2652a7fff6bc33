# D-FINE-S model (upstream dfine_hgnetv2_s_coco.yml): HGNetv2-B0 (stages
# 1-3), 256-d hybrid encoder (depth 0.34, expansion 0.5) and a 3-layer
# decoder on 3 levels with 3/6/3 points. Model only.
_base_ = './dfine_hgnetv2_n.py'
embed_dims = 256
num_levels = 3
model = dict(
    num_feature_levels=num_levels,
    feat_channels=[embed_dims] * num_levels,
    backbone=dict(arch='B0', use_lab=True, out_indices=(1, 2, 3)),
    neck=dict(
        in_channels=[256, 512, 1024],
        hidden_dim=embed_dims,
        feedforward_channels=1024,
        use_encoder_idx=[2],
        expansion=0.5,
        depth_mult=0.34),
    decoder=dict(
        num_layers=3,
        layer_cfg=dict(
            embed_dims=embed_dims,
            feedforward_channels=1024,
            num_levels=num_levels,
            num_points=[3, 6, 3])),
    bbox_head=dict(embed_dims=embed_dims))
