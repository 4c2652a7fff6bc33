# COCO recipe of upstream D-FINE (configs/runtime.yml,
# dfine/include/dataloader.yml and include/optimizer.yml), the parts every
# size shares; the dfine_hgnetv2_{n,s,m,l,x}_coco.py configs set the rest
# (parameter groups, lr, epochs, the policy's stop epoch, multi-scale
# sizes; batch size where it is not 4 per GPU, 32 in all).
# - Data: RT-DETRv2's, which D-FINE's dataloader.yml repeats (photometric
#   distortion, zoom-out, IoU crop, flip, 640 x 640); from stop_epoch on
#   neither those three nor multi-scale batches (RTDETRAugmentStopHook).
# - AdamW, betas (0.9, 0.999), grad clip 0.1, AMP; upstream's regex
#   parameter groups over upstream's names (RegexOptimWrapperConstructor,
#   dfine_upstream_param_names).
# - LinearWarmup over 500 iterations: lr factor min(1, (k + 1) / 500) at
#   iteration k, which MMEngine's LinearLR with start_factor 1 / 500 and
#   end 500 gives exactly; then constant (upstream's MultiStepLR milestone
#   is epoch 500).
# - ModelEMA: decay 0.9999 * (1 - exp(-updates / 1000)), every update
#   (the first included) averaging, from the model training starts with.
# - SyncBN (runtime.yml sync_bn: True); find_unused_parameters False.
_base_ = ['../../../RT-DETR/configs/_base_/rtdetrv2_coco.py']
train_dataloader = dict(batch_size=4, drop_last=True)
optim_wrapper = dict(
    type='AmpOptimWrapper',
    loss_scale='dynamic',
    optimizer=dict(
        type='AdamW', lr=2.5e-4, betas=(0.9, 0.999), weight_decay=1.25e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(
        _delete_=True,
        # include/optimizer.yml; each size config sets its own
        params=[
            dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1.25e-5),
            dict(
                params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
                weight_decay=0.),
        ],
        param_name_map=dict(type='dfine_upstream_param_names')))
param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1 / 500,
        by_epoch=False,
        begin=0,
        end=500)
]
ema_hook = dict(
    _delete_=True,
    type='ModelEMAHook',
    decay=0.9999,
    warmups=1000,
    priority=49)
custom_hooks = [
    ema_hook,
    dict(
        type='RTDETRAugmentStopHook',
        switch_epoch=72,
        switch_pipeline={{_base_.no_aug_pipeline}})
]
auto_scale_lr = dict(enable=False, base_batch_size=32)
