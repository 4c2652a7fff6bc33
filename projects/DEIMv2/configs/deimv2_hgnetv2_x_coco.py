# DEIMv2-HGNetv2-X on COCO, upstream configs/deimv2/deimv2_hgnetv2_x_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): no released checkpoint upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_hgnetv2_x_coco.py 8
# Upstream's values: 58 epochs; policy epochs [4, 29, 50], MixUp (probability
# 0.5) in [4, 29], multi-scale (base_size_repeat 3) until epoch 50; flat-
# cosine lr: warm-up 2000 iterations, flat until epoch 29, last 8 epochs at
# lr_gamma 0.5; AdamW lr 0.0005, weight decay 0.000125; 4 images per GPU on 8
# GPUs; Copy-Blend (probability 0.5) in [4, 50]. Criterion: the matcher change
# at epoch 45 (cost -(p * IoU^4) from then on). Not ported: ema_restart_decay
# 0.9998 (no effect upstream, see the README).
_base_ = ['./_base_/deimv2_s_to_x_coco.py']
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _base_.model.data_preprocessor.batch_augments[0],
            mixup_epochs=[4, 29],
            scales=[480, 512, 544, 576, 608] + [640] * 3 +
            [800, 768, 736, 704, 672],
            stop_epoch=50,
            copyblend_epochs=[4, 50])
    ]),
    feat_channels=[384] * _base_.num_levels,
    backbone=dict(
        arch='B5',
        frozen_stages=0,
        freeze_norm=True,
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/PPHGNetV2_B5_stage1.pth')),
    neck=dict(hidden_dim=384, feedforward_channels=2048),
    decoder=dict(reg_scale=8.0))
# Epochs, policy epochs, lr schedule: the recipe's (_base_/deimv2_coco.py).
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=5e-06),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
            weight_decay=0.),
    ]))
