# CO-DINO R50 fine-tuned on your own COCO-format data with the whole
# mmddp_ext stack. Edit the four things marked EDIT, then
#
#   bash tools/dist_train.sh configs/co_dino_ext_custom.py 8
#
# Overriding EDIT 1 from the command line instead: --cfg-options sets keys
# after this file is read, so `classes=...` alone changes nothing. Set
# metainfo.classes of each dataloader's dataset and each head's num_classes
# (the start-up class-count check names every key that disagrees).
#
# Images without boxes are kept (filter_empty_gt=False): the DDP-safe heads
# train on them as background on any rank without hanging DDP.
_base_ = ['./co_dino_ext.py']

# EDIT 1: your classes.
classes = ('class_a', 'class_b')
# EDIT 2: your data (COCO-format annotation files, image folders).
data_root = 'data/custom/'
train_ann, train_img = 'annotations/train.json', 'images/train/'
val_ann, val_img = 'annotations/val.json', 'images/val/'
# EDIT 3: start from upstream's COCO weights (keys match; the class
# layers are re-initialised for your class count with a warning). Get them
# from mmdetection's projects/CO-DETR/README.md (CO-DINO 5scale R50 1x,
# co_dino_5scale_r50_1x_coco-7481f903.pth).
# load_from = 'checkpoints/co_dino_5scale_r50_1x_coco-7481f903.pth'
load_from = None
# EDIT 4: schedule (upstream's is 12 COCO epochs).
max_epochs = 12

# Every head follows `classes`. MMEngine merges dicts but replaces lists,
# so the list-valued heads are copied from the base with only num_classes
# changed (`_base_` is the merged base config here).
num_classes = len(classes)
model = dict(
    query_head=dict(num_classes=num_classes),
    roi_head=[
        dict(head, bbox_head=dict(head.bbox_head, num_classes=num_classes))
        for head in _base_.model.roi_head
    ],
    bbox_head=[
        dict(head, num_classes=num_classes) for head in _base_.model.bbox_head
    ])
metainfo = dict(classes=classes)
train_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file=train_ann,
        data_prefix=dict(img=train_img),
        filter_cfg=dict(filter_empty_gt=False, min_size=32)))
val_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file=val_ann,
        data_prefix=dict(img=val_img)))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + val_ann)
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[max_epochs - 1],
        gamma=0.1)
]
