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
_base_ = ['./_base_/deimv2_hgnetv2_light_coco.py']
embed_dims = 96
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
    num_queries=150,
    feat_channels=[embed_dims] * _base_.num_levels,
    backbone=dict(arch='Femto'),
    neck=dict(in_channels=[512], hidden_dim=embed_dims),
    decoder=dict(
        layer_cfg=dict(embed_dims=embed_dims, feedforward_channels=256)),
    bbox_head=dict(embed_dims=embed_dims),
    # upstream's PostProcessor keeps num_top_queries=300 (configs/base/
    # deimv2.yml) of the 150 queries x classes, whatever num_queries is
    test_cfg=dict(max_per_img=300))
train_dataloader = dict(dataset=dict(pipeline=train_pipeline, mosaic_prob=0.5))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
