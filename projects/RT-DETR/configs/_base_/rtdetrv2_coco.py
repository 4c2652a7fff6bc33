# COCO recipe of upstream RT-DETRv2 (rtdetrv2_pytorch/configs/runtime.yml,
# rtdetrv2/include/dataloader.yml, include/optimizer.yml) on top of v1's
# data and EMA (rtdetr_coco_6x.py): AMP, a 2000-iteration linear lr
# warm-up, weight decay 0 on norms only (biases keep it), and from epoch
# stop_epoch (0-based) on neither photometric distortion, zoom-out and IoU
# crop (the transforms 'policy') nor multi-scale batches (the collate
# function's stop_epoch): RTDETRAugmentStopHook. 72 epochs, stop 71; the
# model configs set their own. Parameter groups: rtdetrv2's
# include/optimizer.yml (backbone lr 1e-5 except its norms, weight decay 0
# on encoder/decoder norms), over rtdetrv2_pytorch's parameter names.
_base_ = ['./rtdetr_coco_6x.py']
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    paramwise_cfg=dict(
        params=[
            dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1e-5),
            dict(
                params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
                weight_decay=0.),
        ],
        param_name_map=dict(type='rtdetr_upstream_param_names', version=2)))
# upstream LinearWarmup: lr factor min(1, (step + 1) / 2000)
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1 / 2000,
        by_epoch=False,
        begin=0,
        end=2000)
]
no_aug_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True),
    # keep_empty=False keeps an image whose boxes all filter out, with no
    # boxes, as upstream's SanitizeBoundingBoxes (True drops the sample:
    # mmdet re-draws it, and a rank of GT-less images runs out of tries)
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=(640, 640), keep_ratio=False),
    dict(type='PackDetInputs')
]
stop_epoch = 71
custom_hooks = [
    {{_base_.ema_hook}},
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=stop_epoch,
        switch_pipeline=no_aug_pipeline)
]
