# D-FINE-N on COCO, upstream configs/dfine/dfine_hgnetv2_n_coco.yml
# (Peterande/D-FINE): 42.8 AP, 2.12 ms (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_n_coco.py 8
# Upstream's values: 160 epochs, the photometric distortion / zoom-out / IoU
# crop and multi-scale stopped from epoch 148; no multi-scale
# (base_size_repeat: ~); AdamW lr 8e-4, backbone 4e-4, weight decay 1e-4 (0 on
# the groups below); 16 images per GPU on 8 GPUs.
_base_ = ['./_base_/dfine_coco.py', './_base_/dfine_hgnetv2_n.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.D-FINE.dfine'], allow_failed_imports=False)
train_dataloader = dict(batch_size=16)
val_dataloader = dict(batch_size=32)
test_dataloader = val_dataloader
optim_wrapper = dict(
    optimizer=dict(lr=8e-4, weight_decay=1e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=4e-4),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$', lr=4e-4,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 160
stop_epoch = 148
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [{{_base_.ema_hook}},
                dict(
                    type='RTDETRAugmentStopHook',
                    switch_epoch=stop_epoch,
                    switch_pipeline={{_base_.no_aug_pipeline}})]
auto_scale_lr = dict(base_batch_size=128)
