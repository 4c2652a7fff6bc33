# RT-DETR-r50vd-M (or RT-DETRv2-M) fine-tuned on your own COCO-format
# dataset: rtdetr_r50vd_custom.py with the -M model (_base_/
# rtdetr_r50vd_m.py: CSP expansion 0.5, evaluated at decoder layer 3).
#   python tools/convert_rtdetr_checkpoint.py rtdetr_r50vd_m_6x_coco.pth \
#       checkpoints/rtdetr_r50vd_m_coco_mmdet.pth
#   bash tools/dist_train.sh \
#       projects/RT-DETR/configs/rtdetr_r50vd_m_custom.py 2
_base_ = ['./rtdetr_r50vd_custom.py']
model = dict(neck=dict(expansion=0.5), decoder=dict(eval_idx=2))
load_from = 'checkpoints/rtdetr_r50vd_m_coco_mmdet.pth'
