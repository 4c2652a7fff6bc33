# Runtime and schedule of the tiny configs (dino_tiny, co_dino_tiny,
# rtdetr_tiny): 200 iterations on the generated dataset, AdamW with warm-up
# and one step decay, a log line every iteration, one checkpoint and one
# evaluation at the end. Tests shorten it with --cfg-options
# train_cfg.max_iters=N param_scheduler.1.end=N ...
_base_ = ['mmdet::_base_/default_runtime.py']

max_iters = 200
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=4e-4, weight_decay=1e-4),
    clip_grad=dict(max_norm=0.1, norm_type=2))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=20),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_iters,
        by_epoch=False,
        milestones=[int(max_iters * 0.8)],
        gamma=0.1)
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=max_iters,
        max_keep_ckpts=2))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='nccl', timeout=600))
randomness = dict(seed=0)
auto_scale_lr = dict(enable=False, base_batch_size=4)
