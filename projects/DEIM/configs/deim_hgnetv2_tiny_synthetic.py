# DEIM-D-FINE-N shrunk for CPU tests and demos, on the generated synthetic
# data with mmddp_ext switched on: the tiny D-FINE-N of
# projects/D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py (96-px images)
# with DEIM's model changes (SiLU, MAL) and DEIM's whole recipe at toy
# scale: the epoch policy (Mosaic with probability 0.5 instead of zoom-out
# and IoU crop in epoch 0, photometric distortion / zoom-out / IoU crop in
# epoch 1, none after), collate-time MixUp in epoch 0, multi-scale batches
# until epoch 1, flat-cosine lr, ModelEMA, SetEpochHook. Two epochs.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_hgnetv2_tiny_synthetic.py 2
_base_ = ['../../D-FINE/configs/dfine_hgnetv2_tiny_synthetic.py']
custom_imports = dict(
    imports=['projects.D-FINE.dfine', 'projects.DEIM.deim'],
    allow_failed_imports=False)
data_root = 'data/synthetic/'
classes = ('square', 'disc')
image_size = 96
policy_ops = ['DEIMMosaic', 'PhotoMetricDistortion', 'Expand', 'RandomIoUCrop']
train_pipeline = [
    dict(type='DEIMMosaic', output_size=image_size // 2, fill_value=0),
    dict(type='PhotoMetricDistortion'),
    dict(type='Expand', mean=[0, 0, 0], ratio_range=(1, 4), prob=0.5),
    dict(type='RandomIoUCrop', prob=0.8),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=False),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='PackDetInputs')
]
train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='EpochPolicyDataset',
        dataset=dict(
            type='CocoDataset',
            data_root=data_root,
            metainfo=dict(classes=classes),
            ann_file='train/annotations.json',
            data_prefix=dict(img='train/images/'),
            filter_cfg=dict(filter_empty_gt=False, min_size=1),
            pipeline=[
                dict(type='LoadImageFromFile'),
                dict(type='LoadAnnotations', with_bbox=True),
            ]),
        pipeline=train_pipeline,
        policy=dict(epoch=[0, 1, 2], ops=policy_ops),
        mosaic_prob=0.5))
model = dict(
    mlp_act='silu',
    data_preprocessor=dict(batch_augments=[
        dict(
            type='CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[0, 1],
            scales=[96, 96, 128],
            stop_epoch=1)
    ]),
    backbone=dict(frozen_stages=-1, freeze_norm=False),
    decoder=dict(layer_cfg=dict(activation='silu')),
    bbox_head=dict(
        type='DEIMHead',
        loss_cls=dict(
            _delete_=True,
            type='MatchabilityAwareLoss',
            gamma=1.5,
            loss_weight=1.0)))
max_epochs = 2
train_cfg = dict(
    _delete_=True,
    type='EpochBasedTrainLoop',
    max_epochs=max_epochs,
    val_interval=max_epochs)
param_scheduler = [
    dict(
        type='FlatCosineLR',
        warmup_iter=5,
        flat_epoch=1,
        no_aug_epoch=0,
        lr_gamma=0.5,
        start_factor=1 / 500,
        begin=0,
        end=max_epochs,
        by_epoch=True,
        convert_to_iter_based=True)
]
default_hooks = dict(
    checkpoint=dict(
        _delete_=True,
        type='CheckpointHook',
        by_epoch=True,
        interval=1,
        max_keep_ckpts=2))
log_processor = dict(by_epoch=True)
custom_hooks = [
    dict(type='ModelEMAHook', decay=0.9999, warmups=1000, priority=49),
    dict(type='SetEpochHook')
]
