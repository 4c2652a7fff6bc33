# The exact-resume tests' toy run: 3 epochs of 3 iterations per rank
# (12 samples, 2 per batch, 2 ranks), momentum SGD with a per-iteration
# schedule, EMA, checkpoints every epoch. Tests override the loop, the
# workers and the work dir.
custom_imports = dict(
    imports=['mmddp_ext', 'tests.test_runner.exact_resume.toy'],
    allow_failed_imports=False)
runner_type = 'ExtRunner'
model = dict(type='ExactResumeToyModel', log_dir='')
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    collate_fn=dict(type='exact_resume_toy_collate'),
    dataset=dict(type='ExactResumeToyDataset', size=12))
train_cfg = dict(by_epoch=True, max_epochs=3)
optim_wrapper = dict(
    optimizer=dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.2, by_epoch=False, begin=0, end=5),
    dict(type='CosineAnnealingLR', by_epoch=False, begin=5, T_max=9),
]
custom_hooks = [
    dict(type='EMAHook', momentum=0.1),
    dict(type='RecordScheduleHook', log_dir='')
]
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', interval=1),
    logger=dict(type='LoggerHook', interval=1))
env_cfg = dict(dist_cfg=dict(backend='gloo'))
log_level = 'INFO'
randomness = dict(seed=2026)
