# DINO (mmdet's implementation) shrunk for CPU tests and the demo:
# ResNet-18 from scratch, 1 encoder and 2 decoder layers, 30 queries,
# 3 feature levels, narrow FFNs. Same structure and losses as
# mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py. embed_dims stays 256:
# mmdet's DinoTransformerDecoder encodes reference points with a fixed
# 128 features per coordinate, which ties it to 256-d queries.
embed_dims = 256
num_levels = 3
model = dict(
    type='DINO',
    num_queries=30,
    with_box_refine=True,
    as_two_stage=True,
    num_feature_levels=num_levels,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=1),
    backbone=dict(
        type='ResNet',
        depth=18,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(
        type='ChannelMapper',
        in_channels=[128, 256, 512],
        kernel_size=1,
        out_channels=embed_dims,
        act_cfg=None,
        norm_cfg=dict(type='GN', num_groups=32),
        num_outs=num_levels),
    encoder=dict(
        num_layers=1,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims,
                num_levels=num_levels,
                num_heads=8,
                num_points=2,
                dropout=0.0),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=256,
                ffn_drop=0.0))),
    decoder=dict(
        num_layers=2,
        return_intermediate=True,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims, num_heads=8, dropout=0.0),
            cross_attn_cfg=dict(
                embed_dims=embed_dims,
                num_levels=num_levels,
                num_heads=8,
                num_points=2,
                dropout=0.0),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=256,
                ffn_drop=0.0)),
        post_norm_cfg=None),
    positional_encoding=dict(
        num_feats=embed_dims // 2,
        normalize=True,
        offset=0.0,
        temperature=20),
    bbox_head=dict(
        type='DINOHead',
        num_classes=2,
        embed_dims=embed_dims,
        sync_cls_avg_factor=True,
        loss_cls=dict(
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0)),
    dn_cfg=dict(
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=10)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=30))
