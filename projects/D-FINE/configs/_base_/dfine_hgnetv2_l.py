# D-FINE-L model (upstream dfine_hgnetv2_l_coco.yml): HGNetv2-B4 with a
# frozen stem and frozen BN (freeze_at 0, freeze_stem_only, freeze_norm),
# 256-d hybrid encoder, 6-layer decoder. Model only.
_base_ = './dfine_hgnetv2_s.py'
pretrained_backbone = 'checkpoints/PPHGNetV2_B4_stage1.pth'
model = dict(
    backbone=dict(
        arch='B4',
        use_lab=False,
        frozen_stages=0,
        freeze_norm=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained_backbone)),
    neck=dict(in_channels=[512, 1024, 2048], expansion=1.0, depth_mult=1.0),
    decoder=dict(num_layers=6))
