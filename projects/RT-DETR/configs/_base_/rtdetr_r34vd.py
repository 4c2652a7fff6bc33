# RT-DETR-R34vd model (upstream rtdetr_r34vd_6x_coco.yml): the r18vd model
# with ResNet-34-vd (ImageNet weights, nothing frozen) and 4 decoder layers.
#   python tools/convert_rtdetr_checkpoint.py \
#       ResNet34_vd_pretrained_from_paddle.pth \
#       checkpoints/presnet34vd_mmdet.pth
_base_ = ['./rtdetr_r18vd.py']
pretrained_backbone = 'checkpoints/presnet34vd_mmdet.pth'
model = dict(
    backbone=dict(depth=34, init_cfg=dict(checkpoint=pretrained_backbone)),
    decoder=dict(num_layers=4))
