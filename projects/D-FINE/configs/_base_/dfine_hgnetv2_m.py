# D-FINE-M model (upstream dfine_hgnetv2_m_coco.yml): HGNetv2-B2, 256-d
# hybrid encoder (depth 0.67), 4-layer decoder. Model only.
_base_ = './dfine_hgnetv2_s.py'
pretrained_backbone = 'checkpoints/PPHGNetV2_B2_stage1.pth'
model = dict(
    backbone=dict(
        arch='B2',
        use_lab=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained_backbone)),
    neck=dict(in_channels=[384, 768, 1536], expansion=1.0, depth_mult=0.67),
    decoder=dict(num_layers=4))
