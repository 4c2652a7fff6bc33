# RT-DETRv2-S (r18vd), COCO, 120 epochs (upstream
# rtdetrv2_r18vd_120e_coco.yml):
# one params group (weight decay 0 on every norm, backbone lr 1e-4 as the
# rest), no multi-scale batches, augmentation off from epoch 117, xavier
# init of the decoder input projection and FFNs.
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetrv2_r18vd_120e_coco.py 4
_base_ = ['./_base_/rtdetrv2_coco.py', './_base_/rtdetr_r18vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
model = dict(
    xavier_init_proj_ffn=True, data_preprocessor=dict(batch_augments=None))
optim_wrapper = dict(
    paramwise_cfg=dict(
        params=[dict(params='^(?=.*(?:norm|bn)).*$', weight_decay=0.)]))
max_epochs = 120
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [
    {{_base_.ema_hook}},
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=117,
        switch_pipeline={{_base_.no_aug_pipeline}})
]
