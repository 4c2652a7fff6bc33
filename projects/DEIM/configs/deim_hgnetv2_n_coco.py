# DEIM-D-FINE-N on COCO, upstream DEIM
# configs/deim_dfine/deim_hgnetv2_n_coco.yml (ShihuaHuang95/DEIM):
# 43.0 AP (42.8 for D-FINE-N in DEIM's table), 2.12 ms
# (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_hgnetv2_n_coco.py 8
# Upstream's values: 160 epochs; Mosaic / photometric / zoom-out / IoU crop
# policy epochs [4, 78, 148], MixUp in [4, 78); no multi-scale
# (base_size_repeat: ~); flat-cosine lr: warm-up 2000 iterations, flat until
# epoch 7800, last 12 epochs at lr_gamma 1.0; AdamW lr 8e-4, backbone 4e-4,
# weight decay 1e-4 (0 on the groups below); 16 images per GPU on 8 GPUs.
_base_ = [
    './_base_/deim_dfine_coco.py',
    '../../D-FINE/configs/_base_/dfine_hgnetv2_n.py'
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
            mixup_epochs=[4, 78],
            scales=None,
            stop_epoch=148)
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
train_dataloader = dict(
    batch_size=16, dataset=dict(policy=dict(epoch=[4, 78, 148])))
val_dataloader = dict(batch_size=32)
test_dataloader = val_dataloader
optim_wrapper = dict(
    optimizer=dict(lr=8e-4, weight_decay=1e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=4e-4),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$', lr=4e-4,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 160
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        _base_.param_scheduler[0],
        flat_epoch=7800,
        no_aug_epoch=12,
        lr_gamma=1.0,
        end=max_epochs)
]
auto_scale_lr = dict(base_batch_size=128)
