# CO-DINO Swin-L LSJ, 3x schedule: upstream's
# co_dino_5scale_swin_l_lsj_16xb1_3x_coco (60.7 box mAP).
_base_ = ['./co_dino_5scale_swin_l_lsj_16xb1_1x_coco.py']

model = dict(backbone=dict(drop_path_rate=0.5))
train_cfg = dict(max_epochs=36)
# The whole scheduler (a list replaces the base's list; upstream's 3x
# configs write only the milestones and so lose the scheduler type).
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, milestones=[30], gamma=0.1)
]
