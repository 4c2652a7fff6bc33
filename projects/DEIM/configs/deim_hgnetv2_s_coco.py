# DEIM-D-FINE-S on COCO, upstream DEIM
# configs/deim_dfine/deim_hgnetv2_s_coco.yml (ShihuaHuang95/DEIM):
# 49.0 AP (48.7 for D-FINE-S in DEIM's table), 3.49 ms
# (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_hgnetv2_s_coco.py 8
# Upstream's values: 132 epochs; Mosaic / photometric / zoom-out / IoU crop
# policy epochs [4, 64, 120], MixUp in [4, 64); multi-scale sizes
# generate_scales(640, 20) until epoch 120; flat-cosine lr: warm-up 2000
# iterations, flat until epoch 64, last 12 epochs at lr_gamma 0.5; AdamW lr
# 4e-4, backbone 2e-4, weight decay 1e-4 (0 on the groups below); 4 images per
# GPU on 8 GPUs.
_base_ = [
    './_base_/deim_dfine_coco.py',
    '../../D-FINE/configs/_base_/dfine_hgnetv2_s.py'
]
custom_imports = dict(
    imports=['mmddp_ext', 'projects.D-FINE.dfine', 'projects.DEIM.deim'],
    allow_failed_imports=False)
model = dict(
    mlp_act='silu',
    data_preprocessor=dict(batch_augments=[
        dict(
            type='CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[4, 64],
            scales=[480, 512, 544, 576, 608] + [640] * 20 +
            [800, 768, 736, 704, 672],
            stop_epoch=120)
    ]),
    # deim.yml: freeze_at -1, freeze_norm False
    backbone=dict(frozen_stages=-1, freeze_norm=False),
    decoder=dict(layer_cfg=dict(activation='silu')),
    bbox_head=dict(
        type='DEIMHead',
        loss_cls=dict(
            _delete_=True,
            type='MatchabilityAwareLoss',
            gamma=1.5,
            loss_weight=1.0)))
train_dataloader = dict(dataset=dict(policy=dict(epoch=[4, 64, 120])))
optim_wrapper = dict(
    optimizer=dict(lr=4e-4, weight_decay=1e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*bn).*$', lr=2e-4),
        dict(params='^(?=.*(?:norm|bn)).*$', weight_decay=0.),
    ]))
max_epochs = 132
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        _base_.param_scheduler[0],
        flat_epoch=64,
        no_aug_epoch=12,
        end=max_epochs)
]
