# D-FINE-N fine-tuned on your own COCO-format dataset, with mmddp_ext:
# DDP-safe on images without boxes. Upstream:
# configs/dfine/custom/dfine_hgnetv2_n_custom.yml.
#   python tools/convert_dfine_checkpoint.py dfine_n_coco.pth \
#       checkpoints/dfine_n_coco_mmdet.pth \
#       --config projects/D-FINE/configs/_base_/dfine_hgnetv2_n.py
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_n_custom.py 8
# Edit data_root and classes below. load_from keeps every weight except the
# class-sized layers (mismatched shapes are skipped with a warning); the
# backbone's ImageNet init is off, load_from replaces it.
# Recipe: dfine_hgnetv2_n_coco.py's (upstream's parameter groups, EMA, warm-up,
# policy), with upstream's custom-config differences: 220 epochs, the strong
# augmentation and multi-scale stopped from epoch 200 (COCO: 160, 148).
_base_ = ['./dfine_hgnetv2_n_coco.py', '../../../configs/_base_/mmddp_ext.py']
data_root = 'data/custom/'
classes = ('square', 'disc')
metainfo = dict(classes=classes)
model = dict(
    backbone=dict(init_cfg=None), bbox_head=dict(num_classes=len(classes)))
train_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='train/annotations.json',
        data_prefix=dict(img='train/images/')))
val_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='val/annotations.json',
        data_prefix=dict(img='val/images/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'val/annotations.json')
test_evaluator = val_evaluator
max_epochs = 220
stop_epoch = 200
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [{{_base_.ema_hook}},
                dict(
                    type='RTDETRAugmentStopHook',
                    switch_epoch=stop_epoch,
                    switch_pipeline={{_base_.no_aug_pipeline}})]
load_from = 'checkpoints/dfine_n_coco_mmdet.pth'
