# RT-DETR-r34vd, COCO, 72 epochs (upstream rtdetr_r34vd_6x_coco.yml):
# backbone lr 1e-5 (lr_mult 0.1).
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r34vd_6x_coco.py 4
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r34vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
