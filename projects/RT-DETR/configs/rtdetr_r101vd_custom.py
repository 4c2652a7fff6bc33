# RT-DETR-r101vd (or RT-DETRv2-X) fine-tuned on your own COCO-format
# dataset: rtdetr_r50vd_custom.py with the r101vd model (_base_/
# rtdetr_r101vd.py: depth 101, 384-d encoder, feat_channels 384) and
# upstream's r101vd parameter groups (backbone lr 1e-6, nothing else).
#   python tools/convert_rtdetr_checkpoint.py rtdetr_r101vd_6x_coco.pth \
#       checkpoints/rtdetr_r101vd_coco_mmdet.pth
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetr_r101vd_custom.py 2
_base_ = ['./rtdetr_r50vd_custom.py']
neck_dims = 384
model = dict(
    backbone=dict(depth=101),
    neck=dict(hidden_dim=neck_dims, feedforward_channels=2048),
    feat_channels=[neck_dims] * 3)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[dict(params='backbone', lr=1e-6)]))
load_from = 'checkpoints/rtdetr_r101vd_coco_mmdet.pth'
