# D-FINE-N model (upstream configs/dfine/dfine_hgnetv2_n_coco.yml over
# include/dfine_hgnetv2.yml, 80 classes): HGNetv2-B0 (stages 2-3),
# 128-d hybrid encoder and 3-layer decoder on 2 levels, 6 points per level.
# Model only; the recipes (data, schedule, EMA) build on it.
#
# pretrained_backbone: upstream's ImageNet file, loaded as it is (the
# backbone's parameter names are upstream's), from
#   https://github.com/Peterande/storage/releases/download/dfinev1.0/
#   PPHGNetV2_B0_stage1.pth
# another path: --cfg-options model.backbone.init_cfg.checkpoint=PATH
pretrained_backbone = 'checkpoints/PPHGNetV2_B0_stage1.pth'
custom_imports = dict(
    imports=['projects.D-FINE.dfine'], allow_failed_imports=False)
embed_dims = 128
num_levels = 2
model = dict(
    type='DFINE',
    num_queries=300,
    num_feature_levels=num_levels,
    feat_channels=[embed_dims] * num_levels,
    mlp_act='relu',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        # upstream feeds [0, 1] RGB without mean/std normalisation
        mean=[0, 0, 0],
        std=[255, 255, 255],
        bgr_to_rgb=True,
        pad_size_divisor=32),
    backbone=dict(
        type='HGNetv2',
        arch='B0',
        use_lab=True,
        out_indices=(2, 3),
        frozen_stages=-1,
        freeze_norm=False,
        init_cfg=dict(type='Pretrained', checkpoint=pretrained_backbone)),
    neck=dict(
        type='DFINEHybridEncoder',
        in_channels=[512, 1024],
        hidden_dim=embed_dims,
        num_heads=8,
        feedforward_channels=512,
        dropout=0.0,
        enc_act='gelu',
        use_encoder_idx=[1],
        num_encoder_layers=1,
        expansion=0.34,
        depth_mult=0.5,
        act='silu'),
    decoder=dict(
        num_layers=3,
        eval_idx=-1,
        layer_scale=1,
        reg_max=32,
        reg_scale=4.0,
        layer_cfg=dict(
            embed_dims=embed_dims,
            num_heads=8,
            feedforward_channels=512,
            dropout=0.0,
            activation='relu',
            num_levels=num_levels,
            num_points=[6, 6])),
    bbox_head=dict(
        type='DFINEHead',
        num_classes=80,
        embed_dims=embed_dims,
        loss_cls=dict(
            type='RTDETRVarifocalLoss', alpha=0.75, gamma=2.0,
            loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0),
        loss_fgl=dict(type='FineGrainedLocalizationLoss', loss_weight=0.15),
        loss_ddf=dict(
            type='DecoupledDistillationFocalLoss',
            temperature=5.0,
            loss_weight=1.5)),
    # upstream: num_denoising 100, label_noise_ratio 0.5, box_noise_scale 1
    dn_cfg=dict(
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=100)),
    # upstream HungarianMatcher: cost_class 2 (focal, alpha 0.25, gamma 2,
    # log eps 1e-8), cost_bbox 5, cost_giou 2
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(
                    type='FocalLossCost',
                    weight=2.0,
                    alpha=0.25,
                    gamma=2.0,
                    eps=1e-8),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    # upstream DFINEPostProcessor num_top_queries
    test_cfg=dict(max_per_img=300))
