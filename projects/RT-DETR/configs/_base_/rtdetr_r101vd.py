# RT-DETR-R101vd model (upstream rtdetr_r101vd_6x_coco.yml): ResNet-101-vd
# (ImageNet SSLD weights, stem and norms frozen), 384-d hybrid encoder with
# a 2048-d AIFI FFN; the decoder stays 256-d and its input projection
# maps the 384-d levels down (feat_channels).
#   python tools/convert_rtdetr_checkpoint.py \
#       ResNet101_vd_ssld_pretrained_from_paddle.pth \
#       checkpoints/presnet101vd_ssld_mmdet.pth
_base_ = ['./rtdetr_r50vd.py']
pretrained_backbone = 'checkpoints/presnet101vd_ssld_mmdet.pth'
neck_dims = 384
model = dict(
    backbone=dict(depth=101, init_cfg=dict(checkpoint=pretrained_backbone)),
    neck=dict(hidden_dim=neck_dims, feedforward_channels=2048),
    feat_channels=[neck_dims] * 3)
