# What DEIMv2's S-X sizes (HGNetv2 and DINOv3, upstream
# configs/deimv2/deimv2_{hgnetv2,dinov3}_{s,m,l,x}_coco.yml at 0fff8d4)
# share over deimv2_coco.py: MixUp and Copy-Blend at probability 0.5 on
# multi-scale batches (base_size_repeat and the windows below are L / X's
# 58-epoch values, the sizes set their own by copying this entry with
# dict(_base_.model.data_preprocessor.batch_augments[0], ...)), 4 images per
# GPU, 8 per GPU for validation, mosaic probability 0.5 (deim_dfine_coco.py).
_base_ = ['./deimv2_coco.py']
model = dict(
    data_preprocessor=dict(batch_augments=[
        dict(
            type='DEIMv2CollateBatchAugment',
            mixup_prob=0.5,
            mixup_epochs=[4, 29],
            scales=[480, 512, 544, 576, 608] + [640] * 3 +
            [800, 768, 736, 704, 672],
            stop_epoch=50,
            copyblend_prob=0.5,
            copyblend_epochs=[4, 50],
            area_threshold=100,
            num_objects=3,
            with_expand=True,
            expand_ratios=[0.1, 0.25])
    ]))
