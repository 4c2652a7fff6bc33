# CO-DINO Swin-L fine-tuned from Objects365 to COCO, 16 epochs: upstream's
# co_dino_5scale_swin_l_16xb1_16e_o365tococo (64.1 box mAP, the published
# record), 16 GPUs x 1 image, whole mmddp_ext stack. Multi-scale resizing
# with the short side 480-1536 (long side up to 2048), smaller denoising
# box noise with 500 dn queries, lr 1e-4, backbone checkpointing on.
#
# Starts from upstream's Objects365 checkpoint: its class layers (365
# classes) do not fit the 80 COCO classes and are re-initialised, with a
# size-mismatch report; everything else loads. The finished COCO model:
# https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_swin_large_16e_o365tococo-614254c9.pth  # noqa
_base_ = ['./co_dino_5scale_swin_l_16xb1_1x_coco.py']

load_from = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_swin_large_22e_o365-0a33e247.pth'  # noqa

model = dict(
    backbone=dict(with_cp=True),
    query_head=dict(
        dn_cfg=dict(box_noise_scale=0.4, group_cfg=dict(num_dn_queries=500))))

o365_scales = [(short_side, 2048) for short_side in range(480, 1537, 32)]
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='RandomChoice',
        transforms=[
            [dict(type='RandomChoiceResize', scales=o365_scales,
                  keep_ratio=True)],
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
                    scales=o365_scales,
                    keep_ratio=True)
            ],
        ]),
    dict(type='PackDetInputs')
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(2048, 1280), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

optim_wrapper = dict(optimizer=dict(lr=1e-4))
max_epochs = 16
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(type='MultiStepLR', by_epoch=True, milestones=[8], gamma=0.1)
]
