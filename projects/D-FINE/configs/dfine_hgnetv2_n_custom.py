# D-FINE-N fine-tuned on your own COCO-format dataset, with mmddp_ext:
# DDP-safe on images without boxes. Upstream:
# configs/dfine/custom/dfine_hgnetv2_n_custom.yml.
#   python tools/convert_dfine_checkpoint.py dfine_n_coco.pth \
#       checkpoints/dfine_n_coco_mmdet.pth \
#       --config projects/D-FINE/configs/dfine_hgnetv2_n_custom.py
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_n_custom.py 8
# Edit data_root and classes below. load_from keeps every weight except the
# class-sized layers (mismatched shapes are skipped with a warning); the
# backbone's ImageNet init is off, load_from replaces it.
#
# Recipe (upstream's values): data of RT-DETRv2 / D-FINE's
# include/dataloader.yml (photometric distortion, zoom-out, IoU crop, flip,
# 640x640; no multi-scale for N) switched off from epoch 200 of 220; AdamW
# lr 8e-4, backbone 4e-4, betas (0.9, 0.999), weight decay 1e-4 except on
# the neck's and decoder's norms and biases (upstream's regex groups; the
# backbone's BN keeps it, as upstream's '(?!.*norm)' does not match 'bn');
# grad clip 0.1; a 500-iteration linear warm-up, then constant lr
# (upstream MultiStepLR at epoch 500); EMA 0.9999 with 1000 warm-up
# updates; AMP (upstream's --use-amp); 16 images per GPU on 8 GPUs
# (total_batch_size 128).
_base_ = [
    '../../RT-DETR/configs/_base_/rtdetrv2_coco.py',
    './_base_/dfine_hgnetv2_n.py',
    '../../../configs/_base_/mmddp_ext.py',
]
custom_imports = dict(
    imports=['mmddp_ext', 'projects.D-FINE.dfine'], allow_failed_imports=False)
data_root = 'data/custom/'
classes = ('square', 'disc')
metainfo = dict(classes=classes)
model = dict(
    backbone=dict(init_cfg=None), bbox_head=dict(num_classes=len(classes)))
train_dataloader = dict(
    batch_size=16,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='train/annotations.json',
        data_prefix=dict(img='train/images/')))
val_dataloader = dict(
    batch_size=32,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='val/annotations.json',
        data_prefix=dict(img='val/images/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'val/annotations.json')
test_evaluator = val_evaluator
max_epochs = 220
train_cfg = dict(max_epochs=max_epochs)
optim_wrapper = dict(
    optimizer=dict(lr=8e-4, betas=(0.9, 0.999), weight_decay=1e-4),
    # The longest matching key wins: every backbone parameter gets lr
    # 4e-4 with weight decay; elsewhere names with 'norm' or 'bias' get no
    # weight decay (upstream: '^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|
    # bias)).*$').
    paramwise_cfg=dict(
        _delete_=True,
        custom_keys={
            'backbone': dict(lr_mult=0.5),
            'norm': dict(decay_mult=0.0),
            'bias': dict(decay_mult=0.0)
        }))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1 / 500,
        by_epoch=False,
        begin=0,
        end=500)
]
stop_epoch = 200
custom_hooks = [
    dict(
        type='EMAHook',
        ema_type='ExpMomentumEMA',
        momentum=0.0001,
        gamma=1000,
        update_buffers=True,
        priority=49),
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=stop_epoch,
        switch_pipeline={{_base_.no_aug_pipeline}})
]
auto_scale_lr = dict(enable=False, base_batch_size=128)
load_from = 'checkpoints/dfine_n_coco_mmdet.pth'
