# RT-DETR-R50vd-M model (upstream rtdetr_r50vd_m_6x_coco.yml): the r50vd
# model with CSP expansion 0.5, evaluated at decoder layer 3 of 6
# (eval_idx 2; inference stops there).
_base_ = ['./rtdetr_r50vd.py']
model = dict(neck=dict(expansion=0.5), decoder=dict(eval_idx=2))
