# RT-DETR-R50vd model, upstream rtdetr_pytorch/configs/rtdetr/include/
# rtdetr_r50vd.yml: PResNet-50-vd from ImageNet (SSLD v2) weights, stem
# frozen (freeze_at 0 = mmdet frozen_stages 0) and every BN frozen
# (freeze_norm = norm_eval + requires_grad False), hybrid encoder (256-d,
# 1 AIFI layer on stride 32, expansion 1.0), decoder with 6 layers, 300
# queries, 4 points per level, 100 dn queries, VFL 1 / L1 5 / GIoU 2,
# matcher class 2 / L1 5 / GIoU 2, multi-scale training 480-800 px
# (upstream's list of sizes).
#
# pretrained_backbone: upstream's ImageNet file converted by
#   python tools/convert_rtdetr_checkpoint.py \
#       ResNet50_vd_ssld_v2_pretrained_from_paddle.pth \
#       checkpoints/presnet50vd_ssld_v2_mmdet.pth
# (from github.com/lyuwenyu/storage/releases/download/v0.1/); another
# path: --cfg-options model.backbone.init_cfg.checkpoint=PATH
embed_dims = 256
num_levels = 3
pretrained_backbone = 'checkpoints/presnet50vd_ssld_v2_mmdet.pth'
model = dict(
    type='RTDETR',
    num_queries=300,
    num_feature_levels=num_levels,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        # upstream feeds [0, 1] RGB without mean/std normalisation
        mean=[0, 0, 0],
        std=[255, 255, 255],
        bgr_to_rgb=True,
        pad_size_divisor=32,
        # upstream multi_scale (v1 RTDETR, v2 collate_fn scales): one
        # square size per batch from this list (640 three times), nearest
        # interpolation
        batch_augments=[
            dict(
                type='BatchChoiceResize',
                scales=[
                    480, 512, 544, 576, 608, 640, 640, 640, 672, 704, 736,
                    768, 800
                ])
        ]),
    backbone=dict(
        type='ResNetVdRTDETR',
        depth=50,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=0,
        norm_cfg=dict(type='BN', requires_grad=False),
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained_backbone)),
    neck=dict(
        type='HybridEncoder',
        in_channels=[512, 1024, 2048],
        hidden_dim=embed_dims,
        num_heads=8,
        feedforward_channels=1024,
        dropout=0.0,
        enc_act='gelu',
        use_encoder_idx=[2],
        num_encoder_layers=1,
        pe_temperature=10000,
        expansion=1.0,
        depth_mult=1.0,
        act='silu'),
    decoder=dict(
        num_layers=6,
        layer_cfg=dict(
            embed_dims=embed_dims,
            num_heads=8,
            feedforward_channels=1024,
            dropout=0.0,
            num_levels=num_levels,
            num_points=4)),
    bbox_head=dict(
        type='RTDETRHead',
        num_classes=80,
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
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=100)),
    train_cfg=dict(
        assigner=dict(
            type='BatchedHungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0, alpha=0.25, gamma=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=300))
