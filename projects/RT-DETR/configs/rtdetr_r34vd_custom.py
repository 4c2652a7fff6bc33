# RT-DETR-r34vd (or RT-DETRv2-M*) fine-tuned on your own COCO-format
# dataset: rtdetr_r18vd_custom.py's data and mmddp_ext stack with the
# r34vd model (_base_/rtdetr_r34vd.py: depth 34, 4 decoder layers).
#   python tools/convert_rtdetr_checkpoint.py rtdetr_r34vd_dec4_6x_coco.pth \
#       checkpoints/rtdetr_r34vd_coco_mmdet.pth
#   bash tools/dist_train.sh projects/RT-DETR/configs/rtdetr_r34vd_custom.py 2
_base_ = ['./rtdetr_r18vd_custom.py']
model = dict(backbone=dict(depth=34), decoder=dict(num_layers=4))
load_from = 'checkpoints/rtdetr_r34vd_coco_mmdet.pth'
