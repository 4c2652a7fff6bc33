# RT-DETR-r50vd-M, COCO, 72 epochs (upstream rtdetr_r50vd_m_6x_coco.yml):
# evaluated at decoder layer 3 (eval_idx 2).
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetr_r50vd_m_6x_coco.py 4
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r50vd_m.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
