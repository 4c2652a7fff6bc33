# DEIMv2-X on COCO, upstream configs/deimv2/deimv2_dinov3_x_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): 57.8 AP, 50.3M parameters upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_dinov3_x_coco.py 8
# Upstream's values: 58 epochs; policy epochs [4, 29, 50], MixUp (probability
# 0.5) in [4, 29], multi-scale (base_size_repeat 3) until epoch 50; flat-
# cosine lr: warm-up 2000 iterations, flat until epoch 29, last 8 epochs at
# lr_gamma 0.5; AdamW lr 0.0005, weight decay 0.000125; 4 images per GPU on 8
# GPUs; Copy-Blend (probability 0.5) in [4, 50]. Criterion: the matcher change
# at epoch 45 (cost -(p * IoU^4) from then on). Not ported: ema_restart_decay
# 0.9999 (no effect upstream, see the README).
_base_ = ['./_base_/deimv2_dinov3_coco.py']
embed_dims = 256
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
    feat_channels=[embed_dims] * _base_.num_levels,
    backbone=dict(
        name='dinov3_vits16plus',
        interaction_indexes=[5, 8, 11],
        conv_inplane=64,
        hidden_dim=256,
        vit_init_cfg=dict(checkpoint='checkpoints/'
                          'dinov3_vits16plus_pretrain_lvd1689m-4057cbaa.pth')),
    neck=dict(
        in_channels=[256, 256, 256],
        hidden_dim=256,
        feedforward_channels=1024,
        expansion=1.25,
        depth_mult=1.37),
    decoder=dict(
        num_layers=6,
        layer_cfg=dict(embed_dims=embed_dims, feedforward_channels=2048)),
    bbox_head=dict(embed_dims=embed_dims))
# Epochs, policy epochs, lr schedule: the recipe's (_base_/deimv2_coco.py).
optim_wrapper = dict(
    optimizer=dict(weight_decay=0.000125),
    paramwise_cfg=dict(params=[
        # except norm/bn/bias in self.dinov3
        dict(params='^(?=.*.dinov3)(?!.*(?:norm|bn|bias)).*$', lr=1e-05),
        # norm/bn/bias in self.dinov3
        dict(
            params='^(?=.*.dinov3)(?=.*(?:norm|bn|bias)).*$',
            lr=1e-05,
            weight_decay=0.),
        # norm/bn/bias outside self.dinov3
        dict(
            params='^(?=.*(?:sta|encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
