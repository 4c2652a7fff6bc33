# RT-DETR-r18vd fine-tuned on your own COCO-format dataset, with mmddp_ext:
# DDP-safe on images without boxes, auto find_unused_parameters.
#   python tools/convert_rtdetr_checkpoint.py rtdetr_r18vd_6x_coco.pth \
#       checkpoints/rtdetr_r18vd_coco_mmdet.pth
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r18vd_custom.py 2
# Edit data_root, classes and num_classes below. load_from keeps every
# weight except the class-sized layers (mismatched shapes are skipped
# with a warning); a converted v1 or v2 checkpoint of the same size works
# (same model keys). The backbone's ImageNet init is off: load_from
# replaces it. Recipe: rtdetr_r18vd_6x_coco.py's (upstream's parameter
# groups included), 36 epochs.
_base_ = ['./rtdetr_r18vd_6x_coco.py', '../../../configs/_base_/mmddp_ext.py']
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
max_epochs = 36
train_cfg = dict(max_epochs=max_epochs)
load_from = 'checkpoints/rtdetr_r18vd_coco_mmdet.pth'
