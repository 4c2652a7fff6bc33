# A fine-tune for tools/dist_train.sh's self-healing tests: a tiny mmdet
# ResNet-18 with with_cp under the package's stack (AutoDDP and
# CheckpointConflictHook), load_from set by the test, a checkpoint every
# 4 iterations (as a DETR checkpoints once per epoch: not every iteration),
# nothing to download.
custom_imports = dict(
    imports=['tests.test_tools.self_healing_parts'],
    allow_failed_imports=False)
model = dict(type='SelfHealingResNet', with_cp=True, used_calls=0)
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    dataset=dict(type='SelfHealingImages', size=64),
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='default_collate'))
train_cfg = dict(type='IterBasedTrainLoop', max_iters=6)
optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=1),
    checkpoint=dict(
        type='CheckpointHook', by_epoch=False, interval=4, max_keep_ckpts=-1))
custom_hooks = [dict(type='SIGKILLRankOnce', rank=1, at_iter=0, attempt=1)]
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo', timeout=60))
mmddp_ext_cfg = dict(auto_ddp=True, checkpoint_conflict='non_reentrant')
randomness = dict(seed=0)
