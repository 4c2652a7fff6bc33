# RT-DETRv2-M (r50vd-m), COCO, 84 epochs (upstream
# rtdetrv2_r50vd_m_7x_coco.yml):
# evaluated at decoder layer 3 (eval_idx 2), backbone lr 1e-5,
# augmentation and multi-scale off from epoch 81.
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetrv2_r50vd_m_7x_coco.py 4
_base_ = ['./_base_/rtdetrv2_coco.py', './_base_/rtdetr_r50vd_m.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
model = dict(xavier_init_proj_ffn=True)
max_epochs = 84
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [
    {{_base_.ema_hook}},
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=81,
        switch_pipeline={{_base_.no_aug_pipeline}})
]
