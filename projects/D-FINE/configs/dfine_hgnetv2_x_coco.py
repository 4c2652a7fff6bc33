# D-FINE-X on COCO, upstream configs/dfine/dfine_hgnetv2_x_coco.yml
# (Peterande/D-FINE): 55.8 AP, 12.89 ms (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_x_coco.py 8
# Upstream's values: 80 epochs, the photometric distortion / zoom-out / IoU
# crop and multi-scale stopped from epoch 72; multi-scale sizes of
# generate_scales(640, 3) (640 3 times); AdamW lr 2.5e-4, backbone 2.5e-6,
# weight decay 1.25e-4 (0 on the groups below); 4 images per GPU on 8 GPUs.
_base_ = ['./_base_/dfine_coco.py', './_base_/dfine_hgnetv2_x.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.D-FINE.dfine'], allow_failed_imports=False)
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            type='BatchChoiceResize',
            scales=[480, 512, 544, 576, 608] + [640] * 3 +
            [800, 768, 736, 704, 672])
    ]))
optim_wrapper = dict(
    optimizer=dict(lr=2.5e-4, weight_decay=1.25e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=2.5e-6),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
            weight_decay=0.),
    ]))
max_epochs = 80
stop_epoch = 72
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [{{_base_.ema_hook}},
                dict(
                    type='RTDETRAugmentStopHook',
                    switch_epoch=stop_epoch,
                    switch_pipeline={{_base_.no_aug_pipeline}})]
