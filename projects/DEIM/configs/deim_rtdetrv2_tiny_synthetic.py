# DEIM on the RT-DETRv2 port shrunk for CPU tests: configs/rtdetr_tiny.py
# (64-d RT-DETR on the generated synthetic data, mmddp_ext switched on)
# with the model changes deim_rtdetrv2_*_coco.py make (SiLU, the 'as_reg'
# query position head, MAL). The AMP, export and DEIM head tests use it.
#   python tools/make_synthetic_coco.py data/synthetic
#   bash tools/dist_train.sh \
#       projects/DEIM/configs/deim_rtdetrv2_tiny_synthetic.py 2
_base_ = ['../../../configs/rtdetr_tiny.py']
custom_imports = dict(
    imports=['projects.RT-DETR.rtdetr', 'projects.DEIM.deim'],
    allow_failed_imports=False)
model = dict(
    type='DEIMRTDETR',
    mlp_act='silu',
    query_pos_method='as_reg',
    decoder=dict(layer_cfg=dict(activation='silu')),
    bbox_head=dict(
        loss_cls=dict(
            _delete_=True,
            type='MatchabilityAwareLoss',
            gamma=1.5,
            loss_weight=1.0)))
