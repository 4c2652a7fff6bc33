# DEIMv2-S on COCO, upstream configs/deimv2/deimv2_dinov3_s_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): 50.9 AP, 9.7M parameters upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_dinov3_s_coco.py 8
# Upstream's values: 132 epochs; policy epochs [4, 64, 120], MixUp (probability
# 0.5) in [4, 64], multi-scale (base_size_repeat 20) until epoch 120;
# flat-cosine lr: warm-up 2000 iterations, flat until epoch 64, last 12 epochs
# at lr_gamma 0.5; AdamW lr 0.0005, weight decay 0.0001; 4 images per GPU on 8
# GPUs; Copy-Blend (probability 0.5) in [4, 120]. Criterion: the matcher change
# at epoch 100 (cost -(p * IoU^4) from then on). Not ported: ema_restart_decay
# 0.9999 (no effect upstream, see the README).
_base_ = ['./_base_/deimv2_dinov3_coco.py']
embed_dims = 192
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _base_.model.data_preprocessor.batch_augments[0],
            mixup_epochs=[4, 64],
            scales=[480, 512, 544, 576, 608] + [640] * 20 +
            [800, 768, 736, 704, 672],
            stop_epoch=120,
            copyblend_epochs=[4, 120])
    ]),
    feat_channels=[embed_dims] * _base_.num_levels,
    backbone=dict(
        name='vit_tiny',
        embed_dim=192,
        num_heads=3,
        interaction_indexes=[3, 7, 11],
        vit_init_cfg=dict(checkpoint='checkpoints/vitt_distill.pt')),
    neck=dict(
        in_channels=[192, 192, 192],
        hidden_dim=192,
        feedforward_channels=512,
        expansion=0.34,
        depth_mult=0.67),
    decoder=dict(
        layer_cfg=dict(embed_dims=embed_dims, feedforward_channels=512)),
    bbox_head=dict(embed_dims=embed_dims),
    train_cfg=dict(assigner=dict(matcher_change_epoch=100)))
train_dataloader = dict(dataset=dict(policy=dict(epoch=[4, 64, 120])))
max_epochs = 132
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        _base_.param_scheduler[0],
        flat_epoch=64,
        no_aug_epoch=12,
        end=max_epochs)
]
