# RT-DETRv2-M* (r34vd), COCO, 120 epochs (upstream
# rtdetrv2_r34vd_120e_coco.yml):
# backbone lr 5e-5 (its norms without weight decay), weight decay 0 on
# encoder/decoder norms and biases, augmentation and multi-scale off from
# epoch 117.
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetrv2_r34vd_120e_coco.py 4
_base_ = ['./_base_/rtdetrv2_coco.py', './_base_/rtdetr_r34vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
model = dict(xavier_init_proj_ffn=True)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=5e-5),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$', lr=5e-5,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 120
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [
    {{_base_.ema_hook}},
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=117,
        switch_pipeline={{_base_.no_aug_pipeline}})
]
