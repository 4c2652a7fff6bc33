# RT-DETR-R18vd model (upstream rtdetr_r18vd_6x_coco.yml on top of
# include/rtdetr_r50vd.yml): ResNet-18-vd from ImageNet weights, without
# frozen stages or norms (freeze_at -1, freeze_norm False), CSP expansion
# 0.5, 3 decoder layers.
#   python tools/convert_rtdetr_checkpoint.py \
#       ResNet18_vd_pretrained_from_paddle.pth \
#       checkpoints/presnet18vd_mmdet.pth
_base_ = ['./rtdetr_r50vd.py']
pretrained_backbone = 'checkpoints/presnet18vd_mmdet.pth'
model = dict(
    backbone=dict(
        depth=18,
        init_cfg=dict(checkpoint=pretrained_backbone),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False),
    neck=dict(in_channels=[128, 256, 512], expansion=0.5),
    decoder=dict(num_layers=3))
