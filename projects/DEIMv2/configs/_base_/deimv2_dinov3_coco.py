# What DEIMv2's DINOv3 sizes (S, M, L, X; upstream
# configs/deimv2/deimv2_dinov3_{s,m,l,x}_coco.yml at 0fff8d4) share over
# deimv2_s_to_x_coco.py: ImageNet normalisation, the DINOv3 / STA backbone
# in place of HGNetv2 (each size names its ViT, its interaction layers and
# its checkpoint), a 4-layer decoder (X: 6), and the parameter groups of the
# backbone (lr for the ViT, no weight decay on its norm / bias) with S / M's
# lr 2.5e-05 and weight decay 0.0001 (L / X restate the groups).
_base_ = ['./deimv2_s_to_x_coco.py']
model = dict(
    # DINOv3 sizes: ImageNet mean / std (upstream Normalize)
    data_preprocessor=dict(
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]),
    backbone=dict(
        _delete_=True, type='DINOv3STAs',
        vit_init_cfg=dict(type='Pretrained')),
    decoder=dict(num_layers=4))
optim_wrapper = dict(
    optimizer=dict(weight_decay=0.0001),
    paramwise_cfg=dict(params=[
        # except norm/bn/bias in self.dinov3
        dict(params='^(?=.*.dinov3)(?!.*(?:norm|bn|bias)).*$', lr=2.5e-05),
        # norm/bn/bias in self.dinov3
        dict(
            params='^(?=.*.dinov3)(?=.*(?:norm|bn|bias)).*$',
            lr=2.5e-05,
            weight_decay=0.),
        # norm/bn/bias outside self.dinov3
        dict(
            params='^(?=.*(?:sta|encoder|decoder))(?=.*(?:norm|bn|bias)).*$',
            weight_decay=0.),
    ]))
