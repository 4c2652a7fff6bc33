# DEIM-RTDETRv2-r101vd fine-tuned on your own COCO-format dataset, with
# mmddp_ext: DDP-safe on images without boxes. Upstream DEIM trains custom
# data with its COCO YAML and configs/dataset/custom_detection.yml; this is
# deim_rtdetrv2_r101vd_coco.py (every recipe value) on your data.
#   python tools/convert_rtdetr_checkpoint.py UPSTREAM_CHECKPOINT.pth \
#       checkpoints/deim_rtdetrv2_r101vd_coco_mmdet.pth \
#       --config projects/DEIM/configs/deim_rtdetrv2_r101vd_coco.py
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_rtdetrv2_r101vd_custom.py 8
# Edit data_root and classes below. load_from keeps every weight except the
# class-sized layers (mismatched shapes are skipped with a warning); the
# backbone's ImageNet init is off, load_from replaces it.
_base_ = [
    './deim_rtdetrv2_r101vd_coco.py', '../../../configs/_base_/mmddp_ext.py'
]
data_root = 'data/custom/'
classes = ('square', 'disc')
metainfo = dict(classes=classes)
model = dict(
    backbone=dict(init_cfg=None), bbox_head=dict(num_classes=len(classes)))
train_dataloader = dict(
    dataset=dict(
        dataset=dict(
            data_root=data_root,
            metainfo=metainfo,
            ann_file='train/annotations.json',
            data_prefix=dict(img='train/images/'))))
val_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='val/annotations.json',
        data_prefix=dict(img='val/images/')))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'val/annotations.json')
test_evaluator = val_evaluator
load_from = 'checkpoints/deim_rtdetrv2_r101vd_coco_mmdet.pth'
