# DEIM's COCO recipe for RT-DETRv2 models (upstream DEIM configs/base/
# rt_deim.yml over rtdetrv2_r50vd.yml, dataloader.yml, rt_optimizer.yml,
# runtime.yml), the parts every size shares: deim_dfine_coco.py's data
# (EpochPolicyDataset with DEIMMosaic, the policy, SetEpochHook) and
# recipe, with rt_optimizer.yml's differences: 2000 EMA warm-up updates,
# the first iteration at 1 / 2000 of the lr (its LinearWarmup), total
# batch 16, parameter groups over rtdetrv2_pytorch's names. The
# deim_rtdetrv2_{r18vd,r34vd,r50vd_m,r50vd,r101vd}_coco.py configs set
# the rest, and the model (DEIMRTDETR: SiLU FFNs and box MLPs, the
# 'as_reg' query position head, unfrozen backbone; MAL, gamma 1.5, in
# RTDETRHead, with RT-DETRv2's per-layer matching: use_uni_set False).
_base_ = ['./deim_dfine_coco.py']
train_dataloader = dict(batch_size=2)
val_dataloader = dict(batch_size=8)
test_dataloader = val_dataloader
optim_wrapper = dict(
    optimizer=dict(lr=2e-4, weight_decay=1e-4),
    paramwise_cfg=dict(
        param_name_map=dict(
            _delete_=True, type='rtdetr_upstream_param_names', version=2)))
ema_hook = dict(warmups=2000)
custom_hooks = [
    dict(type='ModelEMAHook', decay=0.9999, warmups=2000, priority=49),
    dict(type='SetEpochHook')
]
auto_scale_lr = dict(base_batch_size=16)
# rt_optimizer.yml's LinearWarmup: the first iteration at 1 / 2000 of the lr
# (the sizes set the flat and no-aug epochs)
param_scheduler = [dict(_base_.param_scheduler[0], start_factor=1 / 2000)]
