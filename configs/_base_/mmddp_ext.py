# The one-line opt-in: add this file to `_base_` of an existing MMDet 3.x
# config to run it with the whole mmddp_ext stack:
#
#     _base_ = ['./my_config.py',
#               'path/to/mmddp_ext/configs/_base_/mmddp_ext.py']
#
# MMEngine refuses a key that two `_base_` files both set, so this file sets
# only keys MMDet configs do not set (runner_type, mmddp_ext_cfg) and leaves
# custom_imports, model_wrapper_cfg, find_unused_parameters and
# custom_hooks to your config:
# - mmddp_ext is imported (its components registered) while this file is
#   read. It is an expression, not an `import` statement: MMEngine would
#   read a file with import statements as a lazy-import config. MMEngine
#   drops module-valued keys, so `_mmddp_ext_module` never reaches the
#   config. ExtRunner adds 'mmddp_ext' to custom_imports (keeping yours)
#   before it dumps the config to the work dir, so the dumped config also
#   loads with MMDetection's own tools in a fresh interpreter.
# - runner_type='ExtRunner': launcher='pytorch' on CPU (gloo) or GPU
#   (nccl), a bounded collective timeout, checkpoints that load with
#   torch.load(weights_only=True), launcher-conflict checks, and a
#   class-count check (every num_classes against the dataset's classes)
#   before anything is built. If one of your bases sets runner_type, see
#   "Opt-in" in the README.
# - mmddp_ext_cfg switches on the rest (see ExtRunner's docstring):
#   auto_ddp            AutoDDP works out find_unused_parameters (used when
#                       your config has no model_wrapper_cfg; a
#                       find_unused_parameters key is its explicit choice)
#   checkpoint_conflict CheckpointConflictHook policy for with_cp + DDP
#   cpu_amp             AmpOptimWrapper recipes train in mixed precision on
#                       CPU ranks too (float16 autocast + GradScaler('cpu'),
#                       as on GPUs; on by default); False: float32 there
#   empty_gt_guard      empty_gt_guard_collate for train_dataloader (only
#                       when it names no collate_fn; never val/test)
#   empty_gt_stats      EmptyGTStatsHook: per-rank empty-GT counts in logs
#   exact_resume        a resume, mid-epoch too, continues exactly where the
#                       uninterrupted run would be (data position, sample
#                       and step seeds; on by default; docs/cluster.md)
#   finite_predictions  FinitePredictionsHook: NaN/inf predictions are scored
#                       as misses in val/test, with a warning (on by default)
#   nonfinite_skip      NonFiniteSkipHook: a NaN/inf loss on any rank skips
#                       that step on every rank
#   preemption          PreemptionHook: SIGUSR1/SIGTERM checkpoint at the
#                       same iteration on every rank, then a Slurm requeue
#                       (on by default)
#   rank_consistency    RankConsistencyHook: fail fast on diverging ranks
# Set any of them to None/False in your config to switch it off.
_mmddp_ext_module = __import__('mmddp_ext')
runner_type = 'ExtRunner'
mmddp_ext_cfg = dict(
    auto_ddp=True,
    checkpoint_conflict='non_reentrant',
    cpu_amp=True,
    # 'keep' trains on exactly what the sampler drew; it is right with
    # DDP-safe heads and with mmdet's DINO. Use policy='swap' for heads
    # that are not DDP-safe.
    empty_gt_guard=dict(policy='keep'),
    empty_gt_stats=True,
    exact_resume=True,
    finite_predictions=True,
    nonfinite_skip=dict(),
    preemption=dict(),
    rank_consistency=dict(),
)

# DINO-family configs: DDP-safe contrastive denoising. This base file does
# not force a model type (it also serves non-DINO configs), so add these two
# lines to your own DINO config, after `_base_`:
#
#     model = dict(type='DDPSafeDINO', bbox_head=dict(type='DDPSafeDINOHead'))
#
# A rank whose batch has no GT then gets one zero-weighted dummy denoising
# group instead of none: the same modules, loss keys and collectives on
# every rank, and training is bit-identical to DINO whenever every batch
# has GT. For a custom head, subclass DDPSafeDINOHead instead of DINOHead.
