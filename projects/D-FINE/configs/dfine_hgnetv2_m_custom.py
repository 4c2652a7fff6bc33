# D-FINE-M fine-tuned on your own COCO-format dataset, with mmddp_ext:
# DDP-safe on images without boxes. Upstream:
# configs/dfine/custom/dfine_hgnetv2_m_custom.yml.
#   python tools/convert_dfine_checkpoint.py dfine_m_coco.pth \
#       checkpoints/dfine_m_coco_mmdet.pth \
#       --config projects/D-FINE/configs/_base_/dfine_hgnetv2_m.py
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_m_custom.py 8
# Edit data_root and classes below. load_from keeps every weight except the
# class-sized layers (mismatched shapes are skipped with a warning); the
# backbone's ImageNet init is off, load_from replaces it.
# Recipe: dfine_hgnetv2_m_coco.py's (upstream's parameter groups, EMA, warm-up,
# policy), with upstream's custom-config differences: AdamW lr 2.5e-4, backbone
# 2.5e-5, weight decay 1.25e-4 (COCO: 2e-4, 2e-5, 1e-4).
_base_ = ['./dfine_hgnetv2_m_coco.py', '../../../configs/_base_/mmddp_ext.py']
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
optim_wrapper = dict(
    optimizer=dict(lr=2.5e-4, weight_decay=1.25e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=2.5e-5),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$',
            lr=2.5e-5,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
load_from = 'checkpoints/dfine_m_coco_mmdet.pth'
