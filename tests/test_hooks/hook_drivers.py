"""Drive RankConsistencyHook and NonFiniteSkipHook as the Runner does: on
a fake runner step by step, or in a real tiny-DINO Runner on each rank of
:func:`mmddp_ext.testing.run_on_ranks`."""
import time
from types import SimpleNamespace

import torch
from mmengine.logging import MessageHub
from mmengine.optim import OptimWrapper

from mmddp_ext.hooks import NonFiniteSkipHook
from mmddp_ext.hooks.nonfinite_skip_hook import NonFiniteLossError
from mmddp_ext.hooks.rank_fingerprint import RankDivergenceError
from mmddp_ext.testing import on_rank_device
from ..helpers import build_runner

HEAD = 'model.bbox_head.type'
# The tiny config switches both hooks on through ExtRunner; the tests add
# them themselves (or leave them out, for stock behaviour).
NO_STACK_HOOKS = {
    'mmddp_ext_cfg.rank_consistency': None,
    'mmddp_ext_cfg.nonfinite_skip': None,
}


def fake_runner(model, accumulative_counts=1):
    """A runner stand-in around ``model`` (moved to this rank's device
    first: BaseModel's data preprocessor learns its device from the move)."""
    model = on_rank_device(model)
    optim_wrapper = OptimWrapper(
        torch.optim.SGD(model.parameters(), lr=0.1),
        accumulative_counts=accumulative_counts)
    hub = MessageHub.get_instance(f'rank_consistency_{time.time()}')
    return SimpleNamespace(
        model=model, optim_wrapper=optim_wrapper, message_hub=hub, iter=0)


def train_steps(hooks, runner, batches, scenarios=None):
    """Run ``BaseModel.train_step`` per batch with the hooks' stages (a
    hook or a list, in the order the Runner would call them); returns each
    step's outcome (None, or the error message)."""
    hooks = hooks if isinstance(hooks, list) else [hooks]
    outcomes = []
    for index, batch in enumerate(batches):
        if scenarios is not None:
            runner.model.scenario = scenarios[index]
        for hook in hooks:
            hook.before_train_iter(runner, index, batch)
        try:
            runner.model.train_step(batch, runner.optim_wrapper)
            outcomes.append(None)
        except (RankDivergenceError, NonFiniteLossError) as error:
            outcomes.append(f'{type(error).__name__}: {error}')
        for hook in hooks:
            hook.after_train_iter(runner, index, batch)
        runner.iter += 1
    return outcomes


def tiny_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train_dino(work_dir, data_root, iters, overrides):
    """Train on this rank; the outcome, a digest of the parameters after
    every iteration and the steps skipped for a non-finite loss."""
    import hashlib

    from mmengine.hooks import Hook

    from . import rank_divergence_models  # noqa: F401
    digests = []

    class Digest(Hook):
        priority = 'LOWEST'

        def after_train_iter(self,
                             runner,
                             batch_idx,
                             data_batch=None,
                             outputs=None):
            sha = hashlib.sha256()
            for param in runner.model.module.parameters():
                sha.update(param.detach().cpu().numpy().tobytes())
            digests.append(sha.hexdigest())

    runner = build_runner(work_dir, data_root, iters, overrides)
    runner.register_hook(Digest())
    try:
        runner.train()
        error = None
    except (RankDivergenceError, NonFiniteLossError) as exc:
        error = f'{type(exc).__name__}: {exc}'
    skips = [
        h.total_skips for h in runner.hooks
        if isinstance(h, NonFiniteSkipHook)
    ]
    return dict(
        error=error,
        iters_done=len(digests),
        digests=digests,
        skips=sum(skips) if skips else None)


def dino_overrides(head, hooks=(), **extra):
    """Tiny DINO with ``head``, an unshuffled sampler and ``hooks`` (hook
    configs) in place of the stack's two."""
    overrides = dict(
        NO_STACK_HOOKS, **{
            HEAD: head,
            'train_dataloader.sampler.shuffle': False,
        }, **extra)
    if hooks:
        overrides['custom_hooks'] = list(hooks)
    return overrides
