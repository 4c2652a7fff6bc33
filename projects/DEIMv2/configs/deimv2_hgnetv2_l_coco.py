# DEIMv2-HGNetv2-L on COCO, upstream configs/deimv2/deimv2_hgnetv2_l_coco.yml
# (Intellindust-AI-Lab/DEIMv2 at 0fff8d4): no released checkpoint upstream.
#   bash tools/dist_train.sh \
#       projects/DEIMv2/configs/deimv2_hgnetv2_l_coco.py 8
# Upstream's values: 58 epochs; policy epochs [4, 29, 50], MixUp (probability
# 0.5) in [4, 29], multi-scale (base_size_repeat 4) until epoch 50; flat-
# cosine lr: warm-up 2000 iterations, flat until epoch 29, last 8 epochs at
# lr_gamma 0.5; AdamW lr 0.0005, weight decay 0.000125; 4 images per GPU on 8
# GPUs; Copy-Blend (probability 0.5) in [4, 50]. Criterion: the matcher change
# at epoch 45 (cost -(p * IoU^4) from then on). Not ported: ema_restart_decay
# 0.9999 (no effect upstream, see the README).
_base_ = ['./_base_/deimv2_s_to_x_coco.py']
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            _base_.model.data_preprocessor.batch_augments[0],
            mixup_epochs=[4, 29],
            scales=[480, 512, 544, 576, 608] + [640] * 4 +
            [800, 768, 736, 704, 672],
            stop_epoch=50,
            copyblend_epochs=[4, 50])
    ]),
    backbone=dict(
        init_cfg=dict(
            type='Pretrained',
            checkpoint='checkpoints/PPHGNetV2_B4_stage1.pth')))
# Epochs, policy epochs, lr schedule: the recipe's (_base_/deimv2_coco.py).
