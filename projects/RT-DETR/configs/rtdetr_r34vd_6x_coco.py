# RT-DETR-r34vd, COCO, 72 epochs (upstream rtdetr_r34vd_6x_coco.yml):
# upstream's optimizer.params (backbone lr 1e-5, weight decay 0 on norms;
# its regexes as written, '(?=.*norm|bn)' included).
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r34vd_6x_coco.py 4
_base_ = ['./_base_/rtdetr_coco_6x.py', './_base_/rtdetr_r34vd.py']
custom_imports = dict(
    imports=['mmddp_ext', 'projects.RT-DETR.rtdetr'],
    allow_failed_imports=False)
optim_wrapper = dict(
    paramwise_cfg=dict(params=[
        dict(
            params='^(?=.*backbone)(?=.*norm|bn).*$', weight_decay=0.,
            lr=1e-5),
        dict(params='^(?=.*backbone)(?!.*norm|bn).*$', lr=1e-5),
        dict(
            params='^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
