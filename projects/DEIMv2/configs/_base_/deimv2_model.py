# DEIMv2 model defaults (upstream configs/base/deimv2.yml, 80 classes):
# HGNetv2-B4 (stages 1-3), 256-d hybrid encoder (version deim, csp2, sum),
# 6-layer decoder with RMSNorm, SwiGLU FFNs (2048) and the gateway, points
# [3, 6, 3], SiLU MLPs, DEIMv2Head with MAL (gamma 1.5) and D-FINE's FGL /
# DDF on the union matching, the matcher change at epoch 45. Model only;
# the size configs override what their YAML does.
custom_imports = dict(
    imports=['projects.DEIMv2.deimv2'], allow_failed_imports=False)
embed_dims = 256
num_levels = 3
model = dict(
    type='DEIMv2',
    num_queries=300,
    num_feature_levels=num_levels,
    feat_channels=[embed_dims] * num_levels,
    mlp_act='silu',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        # HGNetv2 sizes: [0, 1] RGB without mean/std normalisation
        mean=[0, 0, 0],
        std=[255, 255, 255],
        bgr_to_rgb=True,
        pad_size_divisor=32),
    backbone=dict(
        type='DEIMv2HGNetv2',
        arch='B4',
        use_lab=False,
        out_indices=(1, 2, 3),
        # deimv2.yml: freeze_at -1, freeze_norm False
        frozen_stages=-1,
        freeze_norm=False),
    neck=dict(
        type='DEIMv2HybridEncoder',
        in_channels=[512, 1024, 2048],
        hidden_dim=embed_dims,
        num_heads=8,
        feedforward_channels=1024,
        dropout=0.0,
        enc_act='gelu',
        use_encoder_idx=[2],
        num_encoder_layers=1,
        expansion=1.0,
        depth_mult=1.0,
        act='silu',
        version='deim'),
    decoder=dict(
        num_layers=6,
        eval_idx=-1,
        reg_max=32,
        reg_scale=4.0,
        lqe_act='silu',
        layer_cfg=dict(
            embed_dims=embed_dims,
            num_heads=8,
            feedforward_channels=2048,
            dropout=0.0,
            num_levels=num_levels,
            num_points=[3, 6, 3],
            use_gateway=True)),
    bbox_head=dict(
        type='DEIMv2Head',
        num_classes=80,
        embed_dims=embed_dims,
        share_bbox_head=False,
        share_score_head=False,
        # DEIMCriterion losses and use_uni_set (the light sizes change
        # both)
        losses=['mal', 'boxes', 'local'],
        use_uni_set=True,
        # DEIMCriterion weight_dict: mal 1, bbox 5, giou 2, fgl 0.15,
        # ddf 1.5; MAL gamma 1.5
        loss_cls=dict(
            type='MatchabilityAwareLoss', gamma=1.5, loss_weight=1.0),
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
    # upstream HungarianMatcher: cost_class 2 (focal, alpha 0.25, gamma 2),
    # cost_bbox 5, cost_giou 2; from matcher_change_epoch on (the sizes set
    # their own), -(p * IoU^4) instead
    train_cfg=dict(
        assigner=dict(
            type='DEIMv2HungarianAssigner',
            change_matcher=True,
            iou_order_alpha=4.0,
            matcher_change_epoch=45,
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
    # upstream PostProcessor num_top_queries
    test_cfg=dict(max_per_img=300))
