# DEIMv2's COCO recipe (upstream configs/base/deimv2.yml over
# dataloader.yml, optimizer.yml, runtime.yml), the parts every size shares;
# deimv2_{size}_coco.py set the rest (model, parameter groups, lr, epochs,
# flat / no-aug epochs, policy epochs, MixUp window, multi-scale sizes,
# batch size, input size).
# - DEIM's recipe machinery (projects/DEIM, deim_dfine_coco.py): Mosaic /
#   photometric distortion / zoom-out / IoU crop switched by the epoch
#   policy (EpochPolicyDataset), collate-time MixUp and multi-scale
#   (CollateBatchAugment), SetEpochHook, flat-cosine lr (FlatCosineLR),
#   AdamW (0.9, 0.999), grad clip 0.1, AMP, ModelEMA (0.9999, 1000
#   warm-up updates), SyncBN (sync_bn='torch').
# - Not yet here (upstream has them; see projects/DEIMv2/README.md,
#   "What remains"): Copy-Blend (collate_fn copyblend_*), the EMA restart
#   at the no-aug epoch (ema_restart_decay), the matcher change
#   (change_matcher, iou_order_alpha, matcher_change_epoch).
_base_ = [
    '../../../DEIM/configs/_base_/deim_dfine_coco.py', './deimv2_model.py'
]
custom_imports = dict(
    imports=[
        'mmddp_ext', 'projects.D-FINE.dfine', 'projects.DEIM.deim',
        'projects.DEIMv2.deimv2'
    ],
    allow_failed_imports=False)
