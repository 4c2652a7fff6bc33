# RT-DETR-r18vd, COCO, 72 epochs (upstream rtdetr_r18vd_6x_coco.yml).
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r18vd_6x_coco.py 4
# Backbone from ImageNet weights (see _base_/rtdetr_r18vd.py), lr 1e-5
# and weight decay 0 on its norms, as upstream's optimizer.params.
# Load upstream weights: tools/convert_rtdetr_checkpoint.py, then load_from.
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r18vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(params='^(?=.*backbone)(?=.*norm).*$', lr=1e-5, weight_decay=0.),
        dict(params='^(?=.*backbone)(?!.*norm).*$', lr=1e-5),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bias)).*$',
            weight_decay=0.),
    ]))
