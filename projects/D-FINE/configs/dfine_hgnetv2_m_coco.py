# D-FINE-M on COCO, upstream configs/dfine/dfine_hgnetv2_m_coco.yml
# (Peterande/D-FINE): 52.3 AP, 5.62 ms (T4, TensorRT FP16) upstream.
#   bash tools/dist_train.sh \
#       projects/D-FINE/configs/dfine_hgnetv2_m_coco.py 8
# Upstream's values: 132 epochs, the photometric distortion / zoom-out / IoU
# crop and multi-scale stopped from epoch 120; multi-scale sizes of
# generate_scales(640, 6) (640 6 times); AdamW lr 2e-4, backbone 2e-5, weight
# decay 1e-4 (0 on the groups below); 4 images per GPU on 8 GPUs.
_base_ = ['./_base_/dfine_coco.py', './_base_/dfine_hgnetv2_m.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.D-FINE.dfine'], allow_failed_imports=False)
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            type='BatchChoiceResize',
            scales=[480, 512, 544, 576, 608] + [640] * 6 +
            [800, 768, 736, 704, 672])
    ]))
optim_wrapper = dict(
    optimizer=dict(lr=2e-4, weight_decay=1e-4),
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=2e-5),
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$', lr=2e-5,
            weight_decay=0.),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
max_epochs = 132
stop_epoch = 120
train_cfg = dict(max_epochs=max_epochs)
custom_hooks = [{{_base_.ema_hook}},
                dict(
                    type='RTDETRAugmentStopHook',
                    switch_epoch=stop_epoch,
                    switch_pipeline={{_base_.no_aug_pipeline}})]
