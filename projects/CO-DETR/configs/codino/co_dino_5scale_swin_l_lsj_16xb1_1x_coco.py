# CO-DINO 5-scale Swin-L with LSJ at 1280, 1x schedule: upstream's
# co_dino_5scale_swin_l_lsj_16xb1_1x_coco (59.3 box mAP), 16 GPUs x 1 image,
# whole mmddp_ext stack. Checkpoint (loads strictly):
# load_from = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/co_dino_5scale_lsj_swin_large_1x_coco-3af73af2.pth'  # noqa
_base_ = ['./co_dino_5scale_r50_lsj_8xb2_1x_coco.py']

image_size = (1280, 1280)
batch_augments = [
    dict(type='BatchFixedSizePad', size=image_size, pad_mask=True)
]
pretrained = 'https://github.com/SwinTransformer/storage/releases/download/v1.0.0/swin_large_patch4_window12_384_22k.pth'  # noqa
model = dict(
    data_preprocessor=dict(batch_augments=batch_augments),
    backbone=dict(
        _delete_=True,
        type='SwinTransformer',
        pretrain_img_size=384,
        embed_dims=192,
        depths=[2, 2, 18, 2],
        num_heads=[6, 12, 24, 48],
        window_size=12,
        mlp_ratio=4,
        qkv_bias=True,
        qk_scale=None,
        drop_rate=0.,
        attn_drop_rate=0.,
        drop_path_rate=0.3,
        patch_norm=True,
        out_indices=(0, 1, 2, 3),
        # True saves memory; under DDP with unused parameters the
        # CheckpointConflictHook of the stack makes it non-reentrant.
        with_cp=False,
        convert_weights=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained)),
    neck=dict(in_channels=[192, 384, 768, 1536]),
    query_head=dict(transformer=dict(encoder=dict(with_cp=6))))

# The base's LSJ and test pipelines with every size at image_size.
SIZE_KEYS = ('scale', 'crop_size', 'size')
load_pipeline = [
    dict(step, **{key: image_size for key in SIZE_KEYS if key in step})
    for step in _base_.load_pipeline
]
train_dataloader = dict(
    batch_size=1,
    num_workers=1,
    dataset=dict(dataset=dict(pipeline=load_pipeline)))
test_pipeline = [
    dict(step, **{key: image_size for key in SIZE_KEYS if key in step})
    for step in _base_.test_pipeline
]
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
