# CO-DINO Swin-L, 3x schedule: upstream's co_dino_5scale_swin_l_16xb1_3x_coco
# (60.0 box mAP). Checkpoint (loads strictly):
# load_from = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_swin_large_3x_coco-d7a6d8af.pth'  # noqa
_base_ = ['./co_dino_5scale_swin_l_16xb1_1x_coco.py']

model = dict(backbone=dict(drop_path_rate=0.6))
train_cfg = dict(max_epochs=36)
# The whole scheduler (see co_dino_5scale_r50_lsj_8xb2_3x_coco.py).
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, milestones=[30], gamma=0.1)
]
