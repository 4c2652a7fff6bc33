# COCO data, 72-epoch schedule and EMA of upstream RT-DETR v1
# (rtdetr_pytorch/configs/runtime.yml, include/dataloader.yml,
# include/optimizer.yml, include/rtdetr_r50vd.yml): 640x640 inputs,
# photometric distortion, zoom-out (p=0.5), IoU crop (p=0.8), flip; batch
# size drawn from upstream's multi_scale list (480-800 px, 640 three
# times, nearest); 4 images per GPU on 4 GPUs;
# SyncBN; AdamW lr 1e-4, weight decay 1e-4, with upstream's regex
# parameter groups (include/optimizer.yml: backbone lr 1e-5, weight decay
# 0 on encoder/decoder biases and norm weights), grad clip 0.1, constant
# lr (no warm-up in v1), EMA 0.9999 with 2000 warm-up steps. mmdet
# transforms stand in for upstream's torchvision v2 ones.
_base_ = ['mmdet::_base_/default_runtime.py']
dataset_type = 'CocoDataset'
data_root = 'data/coco/'
backend_args = None
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PhotoMetricDistortion'),
    # upstream RandomZoomOut(p=0.5); Expand draws its own prob, so no
    # RandomApply around it (that would fire with p=0.25)
    dict(type='Expand', mean=[0, 0, 0], ratio_range=(1, 4), prob=0.5),
    dict(
        type='RandomApply', transforms=dict(type='MinIoURandomCrop'),
        prob=0.8),
    # keep_empty=False keeps an image whose boxes all filter out, with no
    # boxes, as upstream's SanitizeBoundingBoxes (True drops the sample:
    # mmdet re-draws it, and a rank of GT-less images runs out of tries)
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=(640, 640), keep_ratio=False),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(640, 640), keep_ratio=False),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(
    batch_size=4,
    num_workers=4,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=None,
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        filter_cfg=dict(filter_empty_gt=False, min_size=1),
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=8,
    num_workers=4,
    persistent_workers=True,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        ann_file='annotations/instances_val2017.json',
        data_prefix=dict(img='val2017/'),
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader
val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_val2017.json',
    metric='bbox',
    backend_args=backend_args)
test_evaluator = val_evaluator

# multi-scale training: model.data_preprocessor.batch_augments (in the
# model bases, which own model)
# upstream runtime.yml sync_bn: True (no-op on one process)
sync_bn = 'torch'

max_epochs = 72
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
# Upstream's optimizer.params, verbatim: regexes over upstream's parameter
# names (param_name_map gives each of the port's parameters its upstream
# name); a parameter may match one regex only, unmatched ones take the
# optimizer's lr and weight decay. A model config's params list replaces
# this one, as an upstream YAML's does.
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='RegexOptimWrapperConstructor',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(
        params=[
            dict(params='backbone', lr=1e-5),
            dict(
                params='^(?=.*encoder(?=.*bias|.*norm.*weight)).*$',
                weight_decay=0.),
            dict(
                params='^(?=.*decoder(?=.*bias|.*norm.*weight)).*$',
                weight_decay=0.),
        ],
        param_name_map=dict(type='rtdetr_upstream_param_names', version=1)))
# upstream v1: constant lr (MultiStepLR milestone 1000 epochs), no warm-up
param_scheduler = []
# upstream ModelEMA: decay 0.9999 * (1 - exp(-updates / 2000)); mmdet's
# ExpMomentumEMA with momentum 1 - 0.9999 and gamma 2000 is the same curve.
ema_hook = dict(
    type='EMAHook',
    ema_type='ExpMomentumEMA',
    momentum=0.0001,
    gamma=2000,
    update_buffers=True,
    priority=49)
custom_hooks = [ema_hook]
default_hooks = dict(checkpoint=dict(type='CheckpointHook', interval=1))
auto_scale_lr = dict(enable=False, base_batch_size=16)
