# What DEIMv2's light HGNetv2 sizes (Atto, Femto, Pico; upstream
# configs/deimv2/deimv2_hgnetv2_{atto,femto,pico}_coco.yml at 0fff8d4) share
# over deimv2_coco.py: the lite encoder on one level, a 3-layer decoder
# without the gateway, the shared box head, upstream's criterion without
# FGL / DDF, the 500-epoch recipe (policy epochs [4, 250, 400], MixUp and
# Copy-Blend at probability 0.0 in [40000, 15000], multi-scale off until
# epoch 468, warm-up 4000 iterations, flat until epoch 250, last 32 epochs
# at lr_gamma 0.5, the matcher change at epoch 450), 16 images per GPU and
# Femto / Pico's AdamW lr 0.0016. Each deimv2_hgnetv2_{size}_coco.py sets
# its widths, input size, query count, mosaic probability and pipelines;
# the values these depend on (embed_dims, image_size) must be restated
# there, a base file's expressions are evaluated before the size's values.
_base_ = ['./deimv2_coco.py']
embed_dims = 64
num_levels = 2
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
    num_feature_levels=num_levels,
    backbone=dict(
        use_lab=True,
        out_indices=(2, ),
        # upstream starts each light size from B0's file, loading what
        # matches
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/PPHGNetV2_B0_stage1.pth')),
    neck=dict(
        _delete_=True,
        type='DEIMv2LiteEncoder',
        expansion=0.34,
        depth_mult=0.5,
        act='silu'),
    decoder=dict(
        num_layers=3,
        layer_cfg=dict(
            num_levels=num_levels, num_points=[4, 2], use_gateway=False)),
    bbox_head=dict(
        share_bbox_head=True,
        # upstream DEIMCriterion: no FGL / DDF, each output's own matching
        # for its box terms
        losses=['mal', 'boxes'],
        use_uni_set=False),
    train_cfg=dict(assigner=dict(matcher_change_epoch=450)))
train_dataloader = dict(
    batch_size=16, dataset=dict(policy=dict(epoch=[4, 250, 400])))
val_dataloader = dict(batch_size=32)
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
        _base_.param_scheduler[0],
        warmup_iter=4000,
        flat_epoch=250,
        no_aug_epoch=32,
        end=max_epochs)
]
auto_scale_lr = dict(base_batch_size=128)
