# RT-DETR-r50vd, COCO, 72 epochs (upstream rtdetr_r50vd_6x_coco.yml).
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r50vd_6x_coco.py 4
# Backbone from ImageNet SSLD weights (see _base_/rtdetr_r50vd.py).
# Load upstream weights: tools/convert_rtdetr_checkpoint.py, then load_from.
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r50vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
