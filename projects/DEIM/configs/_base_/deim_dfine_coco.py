# DEIM's COCO recipe for D-FINE models (upstream DEIM configs/base/deim.yml
# over dfine_hgnetv2.yml, dataloader.yml, optimizer.yml, runtime.yml), the
# parts every size shares; deim_hgnetv2_{n,s,m,l,x}_coco.py set the rest
# (parameter groups, lr, MixUp window, multi-scale sizes, batch size; the
# epochs, flat / no-aug epochs and policy epochs where they are not the
# 58-epoch schedule below, upstream's for L and X).
# - Dense O2O through the data: Mosaic (DEIMMosaic, DEIM's geometry) and
#   collate-time MixUp, switched epoch by epoch as upstream's transforms
#   policy and collate function do: EpochPolicyDataset (no Mosaic,
#   photometric distortion, zoom-out or IoU crop before policy epoch e0;
#   Mosaic with probability 0.5, instead of zoom-out and IoU crop, until
#   e1; all but Mosaic until e2; none after), CollateBatchAugment (MixUp,
#   probability 0.5, in [mixup_epochs); multi-scale until stop_epoch), and
#   SetEpochHook, which tells both the epoch (from the runner, so a resumed
#   run keeps its policy epoch).
# - Flat-cosine lr (FlatCosineLR): quadratic warm-up over 2000 iterations,
#   flat until flat_epoch, half cosine to lr_gamma times the base lr, which
#   the last no_aug_epoch epochs keep; the first iteration trains with
#   1 / 500 of it (the LinearWarmup that upstream still builds).
# - The model changes (unfrozen backbone with trained BN, SiLU in the
#   decoder FFNs and MLPs, DEIMHead with MAL, gamma 1.5, instead of VFL)
#   and the batch augments are in the size configs, which own `model`.
# - AdamW, betas (0.9, 0.999), grad clip 0.1, AMP, ModelEMA (0.9999, 1000
#   warm-up updates), SyncBN: D-FINE's (dfine_coco.py).
_base_ = ['../../../D-FINE/configs/_base_/dfine_coco.py']
data_root = 'data/coco/'
backend_args = None
load_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
]
# upstream deim.yml ops, in order; the policy switches the first four
train_pipeline = [
    dict(
        type='DEIMMosaic',
        output_size=320,
        rotation_range=10,
        translation_range=(0.1, 0.1),
        scaling_range=(0.5, 1.5),
        fill_value=0),
    dict(type='PhotoMetricDistortion'),
    # upstream RandomZoomOut(fill=0): canvas 1-4 x, p 0.5
    dict(type='Expand', mean=[0, 0, 0], ratio_range=(1, 4), prob=0.5),
    dict(type='RandomIoUCrop', prob=0.8),
    # keep_empty=False keeps an image whose boxes all filter out, with no
    # boxes, as upstream's SanitizeBoundingBoxes (True drops the sample:
    # mmdet re-draws it, and a rank of GT-less images runs out of tries)
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='RandomFlip', prob=0.5),
    dict(type='Resize', scale=(640, 640), keep_ratio=False),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1, 1), keep_empty=False),
    dict(type='PackDetInputs')
]
policy_ops = ['DEIMMosaic', 'PhotoMetricDistortion', 'Expand', 'RandomIoUCrop']
train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='EpochPolicyDataset',
        dataset=dict(
            type='CocoDataset',
            data_root=data_root,
            ann_file='annotations/instances_train2017.json',
            data_prefix=dict(img='train2017/'),
            filter_cfg=dict(filter_empty_gt=False, min_size=1),
            pipeline=load_pipeline,
            backend_args=backend_args),
        pipeline=train_pipeline,
        policy=dict(epoch=[4, 29, 50], ops=policy_ops),
        mosaic_prob=0.5))
optim_wrapper = dict(
    optimizer=dict(lr=5e-4, weight_decay=1.25e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=2.5e-5),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
            weight_decay=0.),
    ]))
max_epochs = 58
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='FlatCosineLR',
        warmup_iter=2000,
        flat_epoch=29,
        no_aug_epoch=8,
        lr_gamma=0.5,
        start_factor=1 / 500,
        begin=0,
        end=max_epochs,
        by_epoch=True,
        convert_to_iter_based=True)
]
custom_hooks = [{{_base_.ema_hook}}, dict(type='SetEpochHook')]
