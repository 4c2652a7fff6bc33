# CO-DINO R50 with large-scale jitter fine-tuned on your own COCO-format
# data, from upstream's COCO weights, whole mmddp_ext stack. Edit the parts
# marked EDIT, then
#
#   bash tools/dist_train.sh \
#       projects/CO-DETR/configs/codino/co_dino_5scale_r50_lsj_custom.py 8
#
# The learning rate follows your GPU count x batch size with
# --auto-scale-lr (base: upstream's 16 images per step).
_base_ = ['./co_dino_5scale_r50_lsj_8xb2_1x_coco.py']

# EDIT 1: your classes. The class count of every head follows from this
# tuple, here and nowhere else.
classes = ('class_a', 'class_b')
# EDIT 2: your data (COCO-format annotation files, image folders).
data_root = 'data/custom/'
train_ann, train_img = 'annotations/train.json', 'images/train/'
val_ann, val_img = 'annotations/val.json', 'images/val/'
# EDIT 3: the weights to start from: upstream's R50 LSJ 3x COCO model
# (54.8 box mAP). Every key loads; the class layers are reported as size
# mismatches and re-initialised for your class count.
load_from = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_lsj_r50_3x_coco-fe5a6829.pth'  # noqa

num_classes = len(classes)
model = dict(
    # load_from replaces every backbone weight: no ResNet-50 download
    backbone=dict(init_cfg=None),
    query_head=dict(num_classes=num_classes),
    # Lists replace the base's lists: copy the base's head, set the count.
    roi_head=[
        dict(
            _base_.model.roi_head[0],
            bbox_head=dict(
                _base_.model.roi_head[0].bbox_head, num_classes=num_classes))
    ],
    bbox_head=[dict(_base_.model.bbox_head[0], num_classes=num_classes)])

# LSJ without CopyPaste, which needs instance masks that custom detection
# data rarely has. Images without boxes are kept (filter_empty_gt=False):
# the DDP-safe heads train on them as background on any rank.
metainfo = dict(classes=classes)
train_pipeline = [
    dict(step, with_mask=False) if step['type'] == 'LoadAnnotations' else step
    for step in _base_.load_pipeline
] + [dict(type='PackDetInputs')]
train_dataloader = dict(
    dataset=dict(
        _delete_=True,
        type='CocoDataset',
        data_root=data_root,
        metainfo=metainfo,
        ann_file=train_ann,
        data_prefix=dict(img=train_img),
        filter_cfg=dict(filter_empty_gt=False, min_size=32),
        pipeline=train_pipeline))
test_pipeline = [
    dict(step, with_mask=False) if step['type'] == 'LoadAnnotations' else step
    for step in _base_.test_pipeline
]
val_dataloader = dict(
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file=val_ann,
        data_prefix=dict(img=val_img),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + val_ann)
test_evaluator = val_evaluator
