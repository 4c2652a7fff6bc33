# DEIM-RTDETRv2-r50vd on COCO, upstream DEIM
# configs/deim_rtdetrv2/deim_r50vd_60e_coco.yml (ShihuaHuang95/DEIM):
# 54.3 AP (53.4 for RT-DETRv2 in DEIM's table), 9.15 ms (T4,
# TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_rtdetrv2_r50vd_coco.py 8
# Upstream's values: 60 epochs; Mosaic / photometric / zoom-out / IoU crop
# policy epochs [4, 34, 58], MixUp in [4, 34); multi-scale sizes
# generate_scales(640, 3) until epoch 58; flat-cosine lr: warm-up 2000
# iterations, flat until epoch 34, last 2 epochs at half the lr; AdamW lr 2e-4,
# backbone 2e-5, weight decay 1e-4 (0 on the groups below); 2 images per GPU on
# 8 GPUs.
_base_ = [
    './_base_/deim_rtdetrv2_coco.py',
    '../../RT-DETR/configs/_base_/rtdetr_r50vd.py'
]
custom_imports = dict(
    imports=[
        'mmddp_ext', 'projects.RT-DETR.rtdetr', 'projects.D-FINE.dfine',
        'projects.DEIM.deim'
    ],
    allow_failed_imports=False)
model = dict(
    type='DEIMRTDETR',
    mlp_act='silu',
    query_pos_method='as_reg',
    xavier_init_proj_ffn=True,
    data_preprocessor=dict(batch_augments=[
        dict(
            type='CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[4, 34],
            scales=[480, 512, 544, 576, 608] + [640] * 3 +
            [800, 768, 736, 704, 672],
            stop_epoch=58)
    ]),
    # rt_deim.yml: PResNet freeze_at -1, freeze_norm False
    backbone=dict(
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False),
    decoder=dict(layer_cfg=dict(activation='silu')),
    bbox_head=dict(
        loss_cls=dict(
            _delete_=True,
            type='MatchabilityAwareLoss',
            gamma=1.5,
            loss_weight=1.0)))
train_dataloader = dict(dataset=dict(policy=dict(epoch=[4, 34, 58])))
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm).*$', lr=2e-5),
        dict(params='^(?=.*(?:norm|bn)).*$', weight_decay=0.),
    ]))
max_epochs = 60
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        _base_.param_scheduler[0],
        flat_epoch=34,
        no_aug_epoch=2,
        end=max_epochs)
]
