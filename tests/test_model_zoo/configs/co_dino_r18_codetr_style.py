# A CO-DINO config written the way upstream CO-DETR writes its configs
# (projects/CO-DETR/configs/codino/*.py in MMDetection): this base file
# registers the project with its own `custom_imports` and leaf configs
# inherit it. Our port of the project is used, at CPU size
# (configs/_base_/models/co_dino_tiny.py), on MMDetection's COCO dataset
# settings; the model-zoo matrix adds configs/_base_/mmddp_ext.py next to
# it in a leaf config, which two bases both setting `custom_imports` broke.
_base_ = [
    'mmdet::_base_/datasets/coco_detection.py',
    'mmdet::_base_/default_runtime.py',
    '../../../configs/_base_/models/co_dino_tiny.py',
]
custom_imports = dict(
    imports=['projects.CO-DETR.codetr'], allow_failed_imports=False)

# Upstream CO-DINO's schedule: AdamW, backbone at a tenth of the lr, 12
# epochs with one step.
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=2e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(custom_keys={'backbone': dict(lr_mult=0.1)}))
max_epochs = 12
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=1)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[11],
        gamma=0.1)
]
