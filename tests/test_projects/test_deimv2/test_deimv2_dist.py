"""DEIMv2-Atto (the tiny synthetic config) on 2 real gloo ranks through
``tools/dist_train.sh``, plain ``MMDistributedDataParallel`` with
``find_unused_parameters=False``, 20 iterations (2 epochs of 10) on a set
where rank 1 reads only images without boxes; a resume from its
checkpoints; upstream's empty-batch behaviour as the negative control.

One launch (``empty_rank``) of
``projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py`` on
generated data: an unshuffled sampler gives rank 1 the odd images, all
without boxes; 2 persistent data workers per rank; a checkpoint per epoch;
validation (pycocotools) at the end. Epoch 1 is where the recipe
switches: the data policy (here ``[1, 1, 2]``: no policy op in epoch 0,
photometric distortion / zoom-out / IoU crop in epoch 1; the tiny
config's Mosaic of epoch 0 would paste other ranks' images into rank 1's),
Copy-Blend starts, the matcher changes to ``-(p * IoU^4)``, MixUp and the
multi-scale batches stop. Every rank records (``GradientRecordHook`` of
``test_dfine/ddp_probe.py``: parameters with a gradient, loss keys,
finiteness, GT count; ``ResumeRecordHook`` of ``test_deim/deim_probe.py``:
the epoch given to the policy and the batch augments;
``DEIMv2RecipeRecordHook`` of ``deimv2_probe.py``: wrapper, workers,
matcher, Copy-Blend, the workers' zoom-out / crop, losses).

The resume builds a Runner in this process from the run's epoch
checkpoints and stops it before its first iteration (the 2-rank run did
the training); the control is one DDP step on 2 ranks started by
``run_on_ranks`` (``control_step_report``, through ``test_deim_dist.py``'s
``upstream_control_step``), cheaper than a second launch and failing as
the launch does (the D-FINE test shows the launch).
"""
import math
import os.path as osp
import re
import time

import pytest
from mmengine.hooks import EMAHook, Hook

from mmddp_ext.testing import make_synthetic_coco, run_on_ranks
from ...helpers import dist_train
from ...test_configs.test_custom_configs_train import as_cli
from ...test_models.dino_utils import build_model, swap_behaviour
from ..test_deim.test_deim_dist import (_records,
                                        check_upstream_control_breaks_ddp,
                                        logged_epoch_iters,
                                        upstream_control_step)
from ..test_dfine.ddp_probe import _UpstreamEmptyDn
from .deimv2_probe import UpstreamEmptyDnLosses, matchers
from .deimv2_utils import PROJECT, model_cfg
from .test_deimv2_model import LIGHT_KEYS

TINY_CONFIG = osp.join(PROJECT, 'configs',
                       'deimv2_hgnetv2_atto_tiny_synthetic.py')
WORLD_SIZE = 2
BATCH = 2
ITERS_PER_EPOCH = 10
EPOCHS = 2
ITERS = ITERS_PER_EPOCH * EPOCHS
EMPTY_RANK = 1
# the epoch where the policy, Copy-Blend and the matcher switch
SWITCH_EPOCH = 1
# policy [1, 1, 2]: stage 0 (no op) in epoch 0, stage 2 (all but Mosaic)
# in epoch 1, stage 3 (no op) from epoch 2 on
POLICY = [1, 1, 2]
VAL_IMAGES = 4
CURVE_WINDOW = 5
PROBES = ('tests.test_projects.test_dfine.ddp_probe',
          'tests.test_projects.test_deim.deim_probe',
          'tests.test_projects.test_deimv2.deimv2_probe')


def _config(root: str) -> str:
    path = osp.join(root, 'probe_config.py')
    imports = [
        'mmddp_ext', 'projects.D-FINE.dfine', 'projects.DEIM.deim',
        'projects.DEIMv2.deimv2', *PROBES
    ]
    lines = [
        f'_base_ = [{TINY_CONFIG!r}]',
        f'custom_imports = dict(imports={imports!r}, '
        'allow_failed_imports=False)',
        'custom_hooks = [dict(type="ModelEMAHook", decay=0.9999, '
        'warmups=1000, priority=49), dict(type="SetEpochHook"), '
        'dict(type="GradientRecordHook"), dict(type="ResumeRecordHook"), '
        'dict(type="DEIMv2RecipeRecordHook")]',
    ]
    with open(path, 'w') as f:
        f.write('\n'.join(lines) + '\n')
    return path


def _options(data: str) -> dict:
    return {
        'train_dataloader.dataset.dataset.data_root': f'{data}/',
        'val_dataloader.dataset.data_root': f'{data}/',
        'test_dataloader.dataset.data_root': f'{data}/',
        'val_evaluator.ann_file': f'{data}/val/annotations.json',
        'test_evaluator.ann_file': f'{data}/val/annotations.json',
        'train_dataloader.sampler.shuffle': False,
        'train_dataloader.num_workers': 2,
        'train_dataloader.persistent_workers': True,
        'train_dataloader.dataset.policy.epoch': POLICY,
        'train_cfg.max_epochs': EPOCHS,
        'train_cfg.val_interval': EPOCHS,
        'default_hooks.logger.interval': 1,
        'randomness.seed': 0,
        # plain DDP: a model_wrapper_cfg is used as given (AutoDDP only
        # replaces a missing one), and the records show the wrapper built
        'model_wrapper_cfg.type': 'MMDistributedDataParallel',
        'model_wrapper_cfg.find_unused_parameters': False,
        # float32 ranks: DDP on empty ranks is the subject here, the AMP
        # recipe's float16 path tests/test_amp's
        'mmddp_ext_cfg.cpu_amp': False,
    }


@pytest.fixture(scope='module')
def empty_rank(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('deimv2_empty_rank'))
    data = osp.join(root, 'data')
    make_synthetic_coco(
        osp.join(data, 'train'),
        num_images=WORLD_SIZE * BATCH * ITERS_PER_EPOCH,
        empty='odd')
    make_synthetic_coco(
        osp.join(data, 'val'), num_images=VAL_IMAGES, empty='none', seed=1)
    config, options = _config(root), _options(data)
    work_dir = osp.join(root, 'work')
    start = time.monotonic()
    output = dist_train(
        config, WORLD_SIZE, work_dir, as_cli(options), timeout=240)
    seconds = time.monotonic() - start
    print(f'\nDEIMv2 2-rank run: {ITERS} iterations in {seconds:.1f} s '
          '(launch to exit, validation included)')
    return dict(
        output=output,
        seconds=seconds,
        work_dir=work_dir,
        config=config,
        options=options,
        grads=_records(work_dir, 'grad_record'),
        epochs=_records(work_dir, 'resume_record'),
        recipe=_records(work_dir, 'recipe_record'))


def test_rank_with_only_empty_images_trains_every_parameter(empty_rank):
    """Plain DDP (``find_unused_parameters=False``) with 2 persistent
    workers on every rank; every iteration on every rank: every trainable
    parameter got a gradient, Atto's full loss keys (dn terms included),
    the same as the peer's, all finite; rank 1 saw no box, rank 0 some in
    every batch; MMEngine logged all 20 iterations."""
    output = empty_rank['output'].stdout
    assert len(logged_epoch_iters(output)) == ITERS
    grads, recipe = empty_rank['grads'], empty_rank['recipe']
    assert len(grads) == len(recipe) == WORLD_SIZE
    for rank, record in enumerate(recipe):
        assert record['wrapper'] == 'MMDistributedDataParallel', rank
        assert record['find_unused_parameters'] is False, rank
        assert record['num_workers'] == 2, rank
        assert record['persistent_workers'] is True, rank
    for rank, record in enumerate(grads):
        assert len(record['records']) == ITERS, rank
        assert record['trainable'] == grads[0]['trainable']
        for step, peer in zip(record['records'], grads[0]['records']):
            assert step['missing_grads'] == [], (rank, step)
            assert set(step['loss_keys']) == LIGHT_KEYS, (rank, step)
            assert step['loss_keys'] == peer['loss_keys']
            assert step['all_finite'], (rank, step)
    gt = [[s['num_gt'] for s in r['records']] for r in grads]
    assert set(gt[EMPTY_RANK]) == {0}
    assert all(n > 0 for n in gt[1 - EMPTY_RANK])


def test_policy_copy_blend_and_matcher_switch_at_epoch_1_on_every_rank(
        empty_rank):
    """On every rank, epoch by epoch: the policy's epoch and stage (0,
    then 2), the batch augments' epoch, the matcher's cost (changed from
    epoch 1 on); the restarted workers ran zoom-out / IoU crop only in
    epoch 1; MixUp ran only in epoch 0, Copy-Blend only in epoch 1
    (pasting boxes on rank 0; none to paste on rank 1); rank 0 matched
    with the first cost in epoch 0 and the product cost in epoch 1.
    Rank 0's log has the worker restart and the matcher change."""
    output = empty_rank['output'].stdout
    assert (
        'SetEpochHook: the data policy changes at epoch '
        f'{SWITCH_EPOCH}; restarting the persistent data workers.') in output
    assert (f'DEIMv2HungarianAssigner: epoch {SWITCH_EPOCH}: matching with '
            '-(p * IoU^4) from now on') in output
    assert len(empty_rank['epochs']) == WORLD_SIZE
    for record in empty_rank['epochs']:
        assert record['epochs'] == [
            dict(epoch=0, dataset_epochs=[0], stages=[0], augment_epochs=[0]),
            dict(epoch=1, dataset_epochs=[1], stages=[2], augment_epochs=[1]),
        ]
    for rank, record in enumerate(empty_rank['recipe']):
        before, after = record['epochs']
        assert (before['epoch'], after['epoch']) == (0, SWITCH_EPOCH)
        assert before['matcher_changed'] == [False], rank
        assert after['matcher_changed'] == [True], rank
        assert before['resized_from_another_shape'] == 0, rank
        assert after['resized_from_another_shape'] > 0, rank
        assert before['mixup_calls'] > 0 and after['mixup_calls'] == 0
        assert before['copy_blend_calls'] == 0, rank
        assert after['copy_blend_calls'] > 0, rank
        pasted = after['copy_blend_pasted']
        assert pasted == 0 if rank == EMPTY_RANK else pasted > 0, rank
    with_gt = empty_rank['recipe'][1 - EMPTY_RANK]['epochs']
    assert with_gt[0]['matchings_with_gt_early_cost'] > 0
    assert with_gt[0]['matchings_with_gt_late_cost'] == 0
    assert with_gt[1]['matchings_with_gt_early_cost'] == 0
    assert with_gt[1]['matchings_with_gt_late_cost'] > 0


def _mean(values) -> float:
    return sum(values) / len(values)


def test_loss_curve_and_coco_map_of_the_run(empty_rank):
    """Prints (``-s``) each rank's total loss, mean of the first and last
    5 iterations, and the COCO bbox mAP of the run's validation
    (pycocotools, EMA weights, on rank 0's log); asserts both exist and
    are finite."""
    curves = []
    for rank, record in enumerate(empty_rank['recipe']):
        losses = [v for e in record['epochs'] for v in e['losses']]
        assert len(losses) == ITERS and all(map(math.isfinite, losses))
        curves.append(losses)
        print(f'\nrank {rank} loss: first {CURVE_WINDOW} iterations '
              f'{_mean(losses[:CURVE_WINDOW]):.3f}, last {CURVE_WINDOW} '
              f'{_mean(losses[-CURVE_WINDOW:]):.3f}')
    both = [_mean(pair) for pair in zip(*curves)]
    print(f'mean of the ranks: {_mean(both[:CURVE_WINDOW]):.3f} -> '
          f'{_mean(both[-CURVE_WINDOW:]):.3f}')
    found = re.findall(r'coco/bbox_mAP: (-?[\d.]+)',
                       empty_rank['output'].stdout)
    assert len(found) == 1, found
    mean_ap = float(found[0])
    assert 0 <= mean_ap <= 1
    print(f'COCO bbox mAP after {ITERS} iterations: {mean_ap:.3f}; run '
          f'{empty_rank["seconds"]:.1f} s')


class _StopAtFirstEpoch(Hook):
    """Records what a resumed Runner starts its first epoch with (lowest
    priority: after ``SetEpochHook``), then stops it: the 2-rank run did
    the training, this checks what the resume restored."""

    priority = 'LOWEST'

    class Reached(Exception):
        """Raised once the state is recorded."""

    def before_train_epoch(self, runner) -> None:
        model = runner.model
        ema = next(h for h in runner.hooks if isinstance(h, EMAHook))
        dataset = runner.train_dataloader.dataset
        augment = model.data_preprocessor.batch_augments[0]
        first, last = augment.copyblend_epochs[0], augment.copyblend_epochs[-1]
        self.state = dict(
            epoch=runner.epoch,
            iter=runner.iter,
            ema_steps=int(ema.ema_model.steps),
            ema_sums=_sums(ema.ema_model.module.state_dict()),
            model_sums=_sums(model.state_dict()),
            dataset_epoch=dataset.epoch,
            stage=dataset.stage(dataset.epoch),
            augment_epoch=augment.epoch,
            copy_blend_window=first <= augment.epoch < last,
            matcher_changed=[a.changed for a in matchers(model)])
        raise self.Reached


def _sums(state: dict) -> dict:
    return {
        k: float(v.double().sum())
        for k, v in state.items() if v.dtype.is_floating_point
    }


@pytest.mark.parametrize('checkpoint, max_epochs, stage, copy_blend',
                         [('epoch_1.pth', EPOCHS, 2, True),
                          ('epoch_2.pth', EPOCHS + 1, 3, False)])
def test_resume_restores_ema_and_policy_epoch_from_the_checkpoint(
        empty_rank, tmp_path, checkpoint, max_epochs, stage, copy_blend):
    """A Runner resumed in this process from the run's checkpoint of the
    switch epoch (``epoch_1.pth``) and of the one after it
    (``epoch_2.pth``, the run extended by an epoch): its EMA is the
    checkpoint's average (weights and update count, not a copy of the
    model, whose weights the checkpoint holds apart), and the policy,
    batch augments and matcher start at the checkpoint's epoch (stage 2
    and Copy-Blend on at epoch 1; stage 3, Copy-Blend off at epoch 2; the
    matcher changed at both)."""
    import torch
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    path = osp.join(empty_rank['work_dir'], checkpoint)
    saved = torch.load(path, map_location='cpu', weights_only=False)
    epoch = saved['meta']['epoch']
    assert epoch == int(checkpoint[len('epoch_'):-len('.pth')])
    cfg = Config.fromfile(empty_rank['config'])
    cfg.merge_from_dict(empty_rank['options'])
    cfg.merge_from_dict({
        'train_cfg.max_epochs': max_epochs,
        'train_cfg.val_interval': max_epochs + 1,
    })
    cfg.work_dir = str(tmp_path)
    cfg.experiment_name = f'deimv2_resume_{checkpoint[:-len(".pth")]}'
    cfg.launcher = 'none'
    cfg.resume = True
    cfg.load_from = path
    runner = RUNNERS.build(cfg)
    stop = _StopAtFirstEpoch()
    runner.register_hook(stop, priority='LOWEST')
    with pytest.raises(_StopAtFirstEpoch.Reached):
        runner.train()
    state = stop.state
    # EMAHook saves the average as the state_dict, the model apart
    assert state['ema_steps'] == int(saved['ema_state_dict']['steps'])
    assert state['ema_steps'] == epoch * ITERS_PER_EPOCH
    assert state['ema_sums'] == pytest.approx(
        _sums(saved['state_dict']), rel=1e-12)
    model_sums = {
        k[len('module.'):]: v
        for k, v in _sums(saved['ema_state_dict']).items()
    }
    assert state['model_sums'] == pytest.approx(model_sums, rel=1e-12)
    assert state['ema_sums'] != pytest.approx(state['model_sums'])
    assert (state['epoch'], state['iter']) == (epoch, epoch * ITERS_PER_EPOCH)
    assert state['dataset_epoch'] == state['augment_epoch'] == epoch
    assert state['stage'] == stage
    assert state['copy_blend_window'] is copy_blend
    assert state['matcher_changed'] == [True]


def _control_rank():
    """``upstream_control_step`` of the tiny Atto model with upstream
    DEIMv2's empty-batch behaviour: rank 0's batch has boxes, rank 1's
    none."""
    model = build_model(
        model_cfg(TINY_CONFIG, **{'data_preprocessor.batch_augments': None}))
    swap_behaviour(model.dn_query_generator, _UpstreamEmptyDn)
    swap_behaviour(model.bbox_head, UpstreamEmptyDnLosses)
    return upstream_control_step(model)


def test_upstream_empty_batch_behaviour_breaks_ddp_on_2_ranks():
    """Negative control: upstream DEIMv2's denoising returns None on a
    batch without GT and its criterion then has no dn terms. On the
    GT-less rank the loss dict lacks every dn key (shorter than its
    peer's, which has every key) and the dn class embedding gets no
    gradient; DDP (``find_unused_parameters=False``) stops that rank at
    the next step ("Expected to have finished reduction") while the rank
    with boxes waits in the gradient all-reduce until the collective
    timeout (what users see as an NCCL timeout)."""
    results = run_on_ranks(_control_rank, WORLD_SIZE, timeout=120)
    check_upstream_control_breaks_ddp(results, LIGHT_KEYS)
