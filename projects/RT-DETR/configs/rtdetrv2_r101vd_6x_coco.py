# RT-DETRv2-X (r101vd), COCO, 72 epochs (upstream rtdetrv2_r101vd_6x_coco.yml):
# backbone lr 1e-6 (its norms 1e-4), augmentation and multi-scale off from
# epoch 71.
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetrv2_r101vd_6x_coco.py 4
_base_ = ['./_base_/rtdetrv2_coco.py', './_base_/rtdetr_r101vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
model = dict(xavier_init_proj_ffn=True)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=1e-6),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn)).*$',
            weight_decay=0.),
    ]))
