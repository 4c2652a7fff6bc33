# DEIMv2-Atto (the real Atto model, 0.5 M parameters) with its recipe at toy
# scale, on the generated synthetic data with mmddp_ext switched on, for CPU
# demos and multi-rank tests: 96-px images, 30 queries, 10 dn queries; the
# epoch policy as DEIM's tiny config (Mosaic with Atto's probability, 0.3,
# instead of zoom-out and IoU crop in epoch 0, photometric distortion /
# zoom-out / IoU crop in epoch 1, none after), collate-time MixUp in epoch 0
# and Copy-Blend in epoch 1 (upstream Atto has neither; on here so that the
# demo runs both), multi-scale batches until epoch 1, Atto's criterion (no
# FGL / DDF, each output's own matching) with the matcher change at epoch 1
# (Atto: 450; here so that the second epoch matches with -(p * IoU^4)),
# flat-cosine lr, ModelEMA, SetEpochHook. Two epochs.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py 2
_base_ = ['./deimv2_hgnetv2_atto_custom.py']
data_root = 'data/synthetic/'
image_size = 96
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
    num_queries=30,
    data_preprocessor=dict(batch_augments=[
        dict(
            type='DEIMv2CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[0, 1],
            scales=[96, 96, 128],
            stop_epoch=1,
            copyblend_prob=0.5,
            copyblend_epochs=[1, 2],
            area_threshold=100,
            num_objects=3,
            with_expand=True,
            expand_ratios=[0.1, 0.25])
    ]),
    dn_cfg=dict(group_cfg=dict(num_dn_queries=10)),
    train_cfg=dict(assigner=dict(matcher_change_epoch=1)),
    test_cfg=dict(max_per_img=30))
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        dataset=dict(data_root=data_root),
        pipeline=train_pipeline,
        policy=dict(epoch=[0, 1, 2])))
val_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'val/annotations.json')
test_evaluator = val_evaluator
max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
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
load_from = None
