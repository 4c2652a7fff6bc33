# DEIMv2-Femto on COCO, upstream configs/deimv2/deimv2_hgnetv2_femto_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): 31.0 AP, 1.0M parameters upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_hgnetv2_femto_coco.py 8
# Upstream's values: 500 epochs; policy epochs [4, 250, 400], MixUp
# (probability 0.0) in [40000, 15000], multi-scale off until epoch 468; flat-
# cosine lr: warm-up 4000 iterations, flat until epoch 250, last 32 epochs at
# lr_gamma 0.5; AdamW lr 0.0016, weight decay 0.0001; 16 images per GPU on 8
# GPUs; Copy-Blend (probability 0.0) in [40000, 15000]. Criterion: the matcher
# change at epoch 450 (cost -(p * IoU^4) from then on) and upstream's losses
# ['mal', 'boxes'] (no FGL / DDF) with use_uni_set False. Not ported:
# ema_restart_decay 0.9999 (no effect upstream, see the README).
_base_ = ['./_base_/deimv2_coco.py']
custom_imports = dict(
    imports=[
        'mmddp_ext', 'projects.D-FINE.dfine', 'projects.DEIM.deim',
        'projects.DEIMv2.deimv2'
    ],
    allow_failed_imports=False)
embed_dims = 96
num_levels = 2
image_size = 416
train_pipeline = [
    dict(
        type='DEIMMosaic',
        output_size=208,
        rotation_range=10,
        translation_range=(0.1, 0.1),
        scaling_range=(0.5, 1.5),
        fill_value=0),
    dict(type='PhotoMetricDistortion'),
    dict(type='Expand', mean=[0, 0, 0], ratio_range=(1, 4), prob=0.5),
    dict(type='RandomIoUCrop', prob=0.8),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(10, 10), keep_empty=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=False),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(10, 10), keep_empty=False),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=False),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            type='DEIMv2CollateBatchAugment',
            mixup_prob=0.0,
            mixup_epochs=[40000, 15000],
            scales=None,
            stop_epoch=468,
            copyblend_prob=0.0,
            copyblend_epochs=[40000, 15000],
            area_threshold=100,
            num_objects=3,
            with_expand=True,
            expand_ratios=[0.1, 0.25])
    ]),
    num_queries=150,
    num_feature_levels=num_levels,
    feat_channels=[embed_dims] * num_levels,
    backbone=dict(
        arch='Femto',
        use_lab=True,
        out_indices=(2, ),
        # upstream starts Femto from B0's file, loading what matches
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/PPHGNetV2_B0_stage1.pth')),
    neck=dict(
        _delete_=True,
        type='DEIMv2LiteEncoder',
        in_channels=[512],
        hidden_dim=96,
        expansion=0.34,
        depth_mult=0.5,
        act='silu'),
    decoder=dict(
        num_layers=3,
        layer_cfg=dict(
            embed_dims=embed_dims,
            feedforward_channels=256,
            num_levels=num_levels,
            num_points=[4, 2],
            use_gateway=False)),
    bbox_head=dict(
        embed_dims=embed_dims,
        share_bbox_head=True,
        # upstream DEIMCriterion: no FGL / DDF, each output's own matching
        # for its box terms
        losses=['mal', 'boxes'],
        use_uni_set=False),
    train_cfg=dict(assigner=dict(matcher_change_epoch=450)),
    test_cfg=dict(max_per_img=150))
train_dataloader = dict(
    batch_size=16,
    dataset=dict(
        pipeline=train_pipeline,
        policy=dict(epoch=[4, 250, 400]),
        mosaic_prob=0.5))
val_dataloader = dict(batch_size=32, dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
optim_wrapper = dict(
    optimizer=dict(lr=0.0016, weight_decay=0.0001),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=0.0008),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$',
            lr=0.0008,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 500
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='FlatCosineLR',
        warmup_iter=4000,
        flat_epoch=250,
        no_aug_epoch=32,
        lr_gamma=0.5,
        start_factor=1 / 500,
        begin=0,
        end=max_epochs,
        by_epoch=True,
        convert_to_iter_based=True)
]
auto_scale_lr = dict(base_batch_size=128)
