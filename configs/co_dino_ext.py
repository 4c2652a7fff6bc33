# CO-DINO 5-scale ResNet-50 (projects/CO-DETR), upstream's hyper-parameters
# (mmdet projects/CO-DETR/configs/codino/co_dino_5scale_r50_8xb2_1x_coco.py,
# the multi-scale-resize variant) with the whole mmddp_ext stack switched
# on: AutoDDP works out find_unused_parameters, CheckpointConflictHook makes
# the encoder's activation checkpointing non-reentrant under DDP, the
# empty-GT guard and stats, DDP-safe denoising and auxiliary queries.
#
#   bash tools/dist_train.sh configs/co_dino_ext.py 8
#
# COCO under data/coco/ (annotations/instances_{train,val}2017.json,
# train2017/, val2017/). Parameter names match upstream, so
# load_from=<an upstream CO-DINO R50 checkpoint> loads with no missing or
# unexpected keys (see projects/CO-DETR/README.md). As upstream, this is
# the LSJ config with the LSJ parts (fixed-size padding, CopyPaste)
# replaced by multi-scale resizing.
_base_ = [
    '../projects/CO-DETR/configs/codino/'
    'co_dino_5scale_r50_lsj_8xb2_1x_coco.py'
]

# No fixed-size padding: the batch padding is masked (use_lsj=False).
model = dict(
    use_lsj=False, data_preprocessor=dict(pad_mask=False, batch_augments=None))

# Upstream's multi-scale training pipeline (the non-LSJ CO-DINO config).
backend_args = None
train_scales = [(480, 1333), (512, 1333), (544, 1333), (576, 1333),
                (608, 1333), (640, 1333), (672, 1333), (704, 1333),
                (736, 1333), (768, 1333), (800, 1333)]
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[[
            dict(
                type='RandomChoiceResize',
                scales=train_scales,
                keep_ratio=True)
        ],
                    [
                        dict(
                            type='RandomChoiceResize',
                            scales=[(400, 4200), (500, 4200), (600, 4200)],
                            keep_ratio=True),
                        dict(
                            type='RandomCrop',
                            crop_type='absolute_range',
                            crop_size=(384, 600),
                            allow_negative_crop=True),
                        dict(
                            type='RandomChoiceResize',
                            scales=train_scales,
                            keep_ratio=True)
                    ]]),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(1333, 800), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
data_root = 'data/coco/'
train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='CocoDataset',
        data_root=data_root,
        ann_file='annotations/instances_train2017.json',
        data_prefix=dict(img='train2017/'),
        # Background images are kept: they are real training signal, and
        # the DDP-safe heads train on them without hanging.
        filter_cfg=dict(filter_empty_gt=False, min_size=32),
        pipeline=train_pipeline))
val_dataloader = dict(
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
