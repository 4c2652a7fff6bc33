# DEIM-D-FINE-L on COCO, upstream DEIM
# configs/deim_dfine/deim_hgnetv2_l_coco.yml (ShihuaHuang95/DEIM):
# 54.7 AP (54.0 for D-FINE-L in DEIM's table), 8.07 ms
# (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_hgnetv2_l_coco.py 8
# Upstream's values: 58 epochs; Mosaic / photometric / zoom-out / IoU crop
# policy epochs [4, 29, 50], MixUp in [4, 29); multi-scale sizes
# generate_scales(640, 4) until epoch 50; flat-cosine lr: warm-up 2000
# iterations, flat until epoch 29, last 8 epochs at lr_gamma 0.5; AdamW lr
# 5e-4, backbone 2.5e-5, weight decay 1.25e-4 (0 on the groups below); 4 images
# per GPU on 8 GPUs.
_base_ = [
    './_base_/deim_dfine_coco.py',
    '../../D-FINE/configs/_base_/dfine_hgnetv2_l.py'
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
            mixup_epochs=[4, 29],
            scales=[480, 512, 544, 576, 608] + [640] * 4 +
            [800, 768, 736, 704, 672],
            stop_epoch=50)
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
# Epochs, policy epochs, lr schedule: _base_/deim_dfine_coco.py's.
