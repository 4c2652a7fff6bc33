# A fine-tune for tools/dist_train.sh's self-healing tests: the toy run
# with a tiny mmdet ResNet-18 (with_cp) under the package's stack (AutoDDP
# and CheckpointConflictHook), load_from set by the test, and a checkpoint
# every 4 iterations (as a DETR checkpoints once per epoch: not every
# iteration).
_base_ = ['./self_healing_toy.py']
model = dict(type='SelfHealingResNet', with_cp=True, used_calls=0)
train_dataloader = dict(dataset=dict(type='SelfHealingImages'))
default_hooks = dict(checkpoint=dict(interval=4))
custom_hooks = [dict(type='SIGKILLRankOnce', rank=1, at_iter=0, attempt=1)]
mmddp_ext_cfg = dict(checkpoint_conflict='non_reentrant')
