# RT-DETR (projects/RT-DETR) shrunk for CPU tests and demos: a half-width
# ResNet-18-vd from scratch, 64-d hybrid encoder (1 AIFI layer) and
# decoder (2 layers), 30 queries, 10 dn queries. Same structure, losses
# and matcher as projects/RT-DETR/configs/rtdetr_r18vd_6x_coco.py.
embed_dims = 64
num_levels = 3
model = dict(
    type='RTDETR',
    num_queries=30,
    num_feature_levels=num_levels,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32),
    backbone=dict(
        type='ResNetVdRTDETR',
        depth=18,
        base_channels=32,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=None),
    neck=dict(
        type='HybridEncoder',
        in_channels=[64, 128, 256],
        hidden_dim=embed_dims,
        num_heads=4,
        feedforward_channels=128,
        expansion=0.5,
        depth_mult=1 / 3,
        num_encoder_layers=1),
    decoder=dict(
        num_layers=2,
        layer_cfg=dict(
            embed_dims=embed_dims,
            num_heads=4,
            feedforward_channels=128,
            dropout=0.0,
            num_levels=num_levels,
            num_points=2)),
    bbox_head=dict(
        type='RTDETRHead',
        num_classes=2,
        embed_dims=embed_dims,
        sync_cls_avg_factor=True,
        loss_cls=dict(
            type='RTDETRVarifocalLoss', alpha=0.75, gamma=2.0,
            loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0)),
    dn_cfg=dict(
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=10)),
    train_cfg=dict(
        assigner=dict(
            type='BatchedHungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=30))
