# RT-DETR-R18vd model (upstream rtdetr_r18vd_6x_coco.yml on top of
# include/rtdetr_r50vd.yml): ResNet-18-vd without frozen stages or norms,
# CSP expansion 0.5, 3 decoder layers.
_base_ = ['./rtdetr_r50vd.py']
model = dict(
    backbone=dict(
        depth=18,
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False),
    neck=dict(in_channels=[128, 256, 512], expansion=0.5),
    decoder=dict(num_layers=3))
