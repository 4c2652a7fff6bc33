# D-FINE-X model (upstream dfine_hgnetv2_x_coco.yml): HGNetv2-B5 with a
# frozen stem and frozen BN, 384-d hybrid encoder (FFN 2048), a 256-d
# 6-layer decoder behind 384 -> 256 input projections, reg_scale 8.
# Model only.
_base_ = './dfine_hgnetv2_l.py'
pretrained_backbone = 'checkpoints/PPHGNetV2_B5_stage1.pth'
model = dict(
    feat_channels=[384, 384, 384],
    backbone=dict(
        arch='B5',
        init_cfg=dict(type='Pretrained', checkpoint=pretrained_backbone)),
    neck=dict(hidden_dim=384, feedforward_channels=2048),
    decoder=dict(reg_scale=8.0))
