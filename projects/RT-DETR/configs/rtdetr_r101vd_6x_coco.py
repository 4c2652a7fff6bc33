# RT-DETR-r101vd, COCO, 72 epochs (upstream rtdetr_r101vd_6x_coco.yml):
# backbone lr 1e-6. Upstream's params list replaces the included one, so
# encoder and decoder biases and norms keep weight decay 1e-4.
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetr_r101vd_6x_coco.py 4
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r101vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[dict(params='backbone', lr=1e-6)]))
