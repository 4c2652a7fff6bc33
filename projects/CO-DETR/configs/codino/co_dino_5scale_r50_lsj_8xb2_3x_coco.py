# CO-DINO R50 LSJ, 3x schedule (36 epochs, lr drop after 30): upstream's
# co_dino_5scale_r50_lsj_8xb2_3x_coco (54.8 box mAP). Checkpoint:
# load_from = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_lsj_r50_3x_coco-fe5a6829.pth'  # noqa
_base_ = ['./co_dino_5scale_r50_lsj_8xb2_1x_coco.py']

train_cfg = dict(max_epochs=36)
# The whole scheduler (a list replaces the base's list; upstream's 3x
# configs write only the milestones and so lose the scheduler type).
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, milestones=[30], gamma=0.1)
]
