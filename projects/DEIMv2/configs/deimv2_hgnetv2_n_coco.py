# DEIMv2-N on COCO, upstream configs/deimv2/deimv2_hgnetv2_n_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): 43.0 AP, 3.6M parameters upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_hgnetv2_n_coco.py 8
# Upstream's values: 160 epochs; policy epochs [4, 78, 148], MixUp (probability
# 0.5) in [4, 78], multi-scale off until epoch 148; flat-cosine lr: warm-up
# 2000 iterations, flat until epoch 7800, last 12 epochs at lr_gamma 1.0; AdamW
# lr 0.0008, weight decay 0.0001; 4 images per GPU on 8 GPUs; Copy-Blend
# (probability 0.4) in [4, 78]. Criterion: the matcher change at epoch 136
# (cost -(p * IoU^4) from then on). Not ported: ema_restart_decay 0.9999 (no
# effect upstream, see the README).
_base_ = ['./_base_/deimv2_coco.py']
embed_dims = 128
num_levels = 2
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            type='DEIMv2CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[4, 78],
            scales=None,
            stop_epoch=148,
            copyblend_prob=0.4,
            copyblend_epochs=[4, 78],
            area_threshold=100,
            num_objects=3,
            with_expand=True,
            expand_ratios=[0.1, 0.25])
    ]),
    num_queries=300,
    num_feature_levels=num_levels,
    feat_channels=[embed_dims] * num_levels,
    backbone=dict(
        arch='B0',
        use_lab=True,
        out_indices=(2, 3),
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/PPHGNetV2_B0_stage1.pth')),
    neck=dict(
        in_channels=[512, 1024],
        hidden_dim=128,
        feedforward_channels=512,
        use_encoder_idx=[1],
        expansion=0.34,
        depth_mult=0.5,
        version='dfine'),
    decoder=dict(
        num_layers=3,
        layer_cfg=dict(
            embed_dims=embed_dims,
            feedforward_channels=512,
            num_levels=num_levels,
            num_points=[6, 6],
            use_gateway=True)),
    bbox_head=dict(embed_dims=embed_dims),
    train_cfg=dict(assigner=dict(matcher_change_epoch=136)),
    test_cfg=dict(max_per_img=300))
train_dataloader = dict(
    batch_size=4,
    dataset=dict(policy=dict(epoch=[4, 78, 148]), mosaic_prob=0.5))
optim_wrapper = dict(
    optimizer=dict(lr=0.0008, weight_decay=0.0001),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=0.0004),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$',
            lr=0.0004,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 160
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='FlatCosineLR',
        warmup_iter=2000,
        flat_epoch=7800,
        no_aug_epoch=12,
        lr_gamma=1.0,
        start_factor=1 / 500,
        begin=0,
        end=max_epochs,
        by_epoch=True,
        convert_to_iter_based=True)
]
