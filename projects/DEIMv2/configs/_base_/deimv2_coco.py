# DEIMv2's COCO recipe (upstream configs/base/deimv2.yml over
# dataloader.yml, optimizer.yml, runtime.yml), the parts every size shares;
# deimv2_{size}_coco.py set the rest (model, parameter groups, lr, MixUp
# and Copy-Blend windows and probabilities, multi-scale sizes, batch size,
# input size; the epochs, flat / no-aug epochs and policy epochs where they
# are not DEIM's 58-epoch schedule).
# - DEIM's recipe machinery (projects/DEIM, deim_dfine_coco.py): Mosaic /
#   photometric distortion / zoom-out / IoU crop switched by the epoch
#   policy (EpochPolicyDataset), collate-time MixUp and multi-scale
#   (CollateBatchAugment, which DEIMv2's DEIMv2CollateBatchAugment extends
#   with Copy-Blend: collate_fn copyblend_*, area_threshold, num_objects,
#   with_expand, expand_ratios), SetEpochHook, flat-cosine lr (FlatCosineLR),
#   AdamW (0.9, 0.999), grad clip 0.1, AMP, ModelEMA (0.9999, 1000
#   warm-up updates), SyncBN (sync_bn='torch').
# - DEIMv2's criterion (DEIMv2Head with DEIMv2HungarianAssigner,
#   _base_/deimv2_model.py): MAL, boxes and FGL / DDF on the union matching
#   (the light sizes: losses ['mal', 'boxes'], use_uni_set False), and the
#   matcher change (change_matcher, iou_order_alpha 4, the sizes'
#   matcher_change_epoch; the epoch from SetEpochHook).
# - Not ported: the EMA restart at the no-aug epoch (ema_restart_decay):
#   upstream's decay change has no effect and its reloads of the best
#   stage-1 checkpoint are a validation-driven search (see
#   projects/DEIMv2/README.md).
_base_ = [
    '../../../DEIM/configs/_base_/deim_dfine_coco.py', './deimv2_model.py'
]
custom_imports = dict(
    imports=[
        'mmddp_ext', 'projects.D-FINE.dfine', 'projects.DEIM.deim',
        'projects.DEIMv2.deimv2'
    ],
    allow_failed_imports=False)
