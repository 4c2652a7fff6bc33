"""DEIMv2-Atto (the tiny synthetic config) on 2 real gloo ranks
(``tools/train.py`` as ``tools/dist_train.sh`` starts it), plain
``MMDistributedDataParallel`` with ``find_unused_parameters=False``, 30
iterations (3 epochs of 10) on a set where rank 1 reads only images
without boxes, across the epochs where the recipe switches, Mosaic in the
data workers included; a resume from its checkpoints; upstream's
empty-batch behaviour as the negative control.

One run (``empty_rank``; on ranks forked with their imports done,
``tests/helpers.py::train_on_ranks``: the subject is what DDP does with
the recipe, not the launcher, and until 2026-11-29 a launch of
``tools/dist_train.sh``) of
``projects/DEIMv2/configs/deimv2_hgnetv2_atto_tiny_synthetic.py`` on
generated data: an unshuffled sampler gives rank 1 the odd images, all
without boxes; 2 persistent data workers per rank; a checkpoint per epoch;
validation (pycocotools) at the end. The recipe switches twice:

- epoch 1: Copy-Blend starts (for one epoch), the matcher changes to
  ``-(p * IoU^4)``, MixUp (epoch 0 only) and the multi-scale batches stop;
- epoch 2: the data policy (here ``[2, 3, 3]``) goes from stage 0 (no
  policy op, epochs 0 and 1) to stage 1: each sample draws the config's
  Mosaic (``mosaic_prob``) or, without it, zoom-out / IoU crop, with
  photometric distortion in both; ``SetEpochHook`` restarts the
  persistent workers so that they see it (where upstream users report
  Mosaic deadlocks with workers: D-FINE #311, DEIMv2 #93).

The policy is shifted from the tiny config's ``[0, 1, 2]`` so that rank
1 is strictly GT-less for 20 iterations (epochs 0 and 1: Mosaic draws
three other images of the whole set into a sample, which gives rank 1
boxes); in epoch 2 the boxes rank 1 trains with are Mosaic's alone
(Copy-Blend pastes only from the same batch and is off again, MixUp is
off), which is how the test sees that Mosaic ran in the restarted
workers. The tiny config's schedule ends at its 2 epochs: epoch 2 trains
at the last learning rate. Every rank records (``GradientRecordHook`` of
``test_dfine/ddp_probe.py``: parameters with a gradient, loss keys,
finiteness, GT count; ``ResumeRecordHook`` of ``test_deim/deim_probe.py``:
the epoch given to the policy and the batch augments;
``DEIMv2RecipeRecordHook`` of ``deimv2_probe.py``: wrapper, workers and
their process ids, matcher, Copy-Blend, MixUp, the workers' zoom-out /
crop, losses).

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
from ...helpers import train_on_ranks
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
EPOCHS = 3
ITERS = ITERS_PER_EPOCH * EPOCHS
EMPTY_RANK = 1
# the epoch where Copy-Blend starts and the matcher changes (tiny config)
SWITCH_EPOCH = 1
# the epoch where the data policy switches to its Mosaic stage
POLICY_EPOCH = 2
# EpochPolicyDataset.stage: stage 0 (no op) in epochs 0 and 1, stage 1
# (Mosaic, or zoom-out / IoU crop without it) in epoch 2, stage 3 (no op)
# from epoch 3 on
POLICY = [POLICY_EPOCH, POLICY_EPOCH + 1, POLICY_EPOCH + 1]
# the iterations before the policy switch: rank 1 strictly GT-less
GT_LESS_ITERS = ITERS_PER_EPOCH * POLICY_EPOCH
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
    output = train_on_ranks(
        config, WORLD_SIZE, work_dir, as_cli(options), timeout=240)
    assert output.returncode == 0, output.stdout[-4000:]
    seconds = time.monotonic() - start
    print(f'\nDEIMv2 2-rank run: {ITERS} iterations in {seconds:.1f} s '
          '(rank start to exit, validation included)')
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
    the same as the peer's, all finite; rank 1 saw no box in the 20
    iterations before the Mosaic epoch, rank 0 some in every batch;
    MMEngine logged all 30 iterations."""
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
    assert set(gt[EMPTY_RANK][:GT_LESS_ITERS]) == {0}
    assert all(n > 0 for n in gt[1 - EMPTY_RANK])


def test_copy_blend_and_matcher_switch_at_epoch_1_on_every_rank(empty_rank):
    """On every rank, epoch by epoch: the batch augments' epoch and the
    matcher's cost (changed from epoch 1 on); MixUp ran only in epoch 0,
    Copy-Blend only in epoch 1 (pasting boxes on rank 0; none to paste on
    rank 1); rank 0 matched with the first cost in epoch 0 and the product
    cost from epoch 1 on, rank 1 matched nothing before the Mosaic epoch.
    Rank 0's log has the matcher change."""
    output = empty_rank['output'].stdout
    assert (f'DEIMv2HungarianAssigner: epoch {SWITCH_EPOCH}: matching with '
            '-(p * IoU^4) from now on') in output
    assert len(empty_rank['epochs']) == WORLD_SIZE
    for record in empty_rank['epochs']:
        assert [e['augment_epochs'] for e in record['epochs']] == [[0], [1],
                                                                   [2]]
    for rank, record in enumerate(empty_rank['recipe']):
        epochs = record['epochs']
        assert [e['epoch'] for e in epochs] == list(range(EPOCHS)), rank
        assert [e['matcher_changed'] for e in epochs] == [[False], [True],
                                                          [True]], rank
        assert [e['matcher_epochs'] for e in epochs] == [[0], [1], [2]]
        assert epochs[0]['mixup_calls'] > 0, rank
        assert epochs[1]['mixup_calls'] == epochs[2]['mixup_calls'] == 0
        assert epochs[0]['copy_blend_calls'] == 0, rank
        assert epochs[1]['copy_blend_calls'] > 0, rank
        assert epochs[2]['copy_blend_calls'] == 0, rank
        pasted = epochs[SWITCH_EPOCH]['copy_blend_pasted']
        assert pasted == 0 if rank == EMPTY_RANK else pasted > 0, rank
    with_gt = empty_rank['recipe'][1 - EMPTY_RANK]['epochs']
    assert with_gt[0]['matchings_with_gt_early_cost'] > 0
    assert with_gt[0]['matchings_with_gt_late_cost'] == 0
    for epoch in with_gt[SWITCH_EPOCH:]:
        assert epoch['matchings_with_gt_early_cost'] == 0
        assert epoch['matchings_with_gt_late_cost'] > 0
    gt_less = empty_rank['recipe'][EMPTY_RANK]['epochs'][:POLICY_EPOCH]
    for epoch in gt_less:
        assert epoch['matchings_with_gt_early_cost'] == 0
        assert epoch['matchings_with_gt_late_cost'] == 0


def test_policy_switch_runs_mosaic_in_restarted_workers_on_every_rank(
        empty_rank):
    """The data policy's Mosaic stage in persistent workers across the
    switch, on every rank: the policy's epoch and stage per epoch (0, 0,
    1); the same 2 worker processes loaded epochs 0 and 1, 2 new ones
    epoch 2 (rank 0's log: the restart, at epoch 2 only); in epoch 2 the
    restarted workers ran Mosaic (some batches they load for the GT-less
    rank carry boxes, counted before the batch augments: in the pipeline
    only Mosaic draws other images, from the whole set; MixUp and
    Copy-Blend, which mix only the batch's own images, are off; its
    matcher matched them) and, in the other samples, zoom-out / IoU crop
    (samples resized from another shape than the file's, none before)."""
    output = empty_rank['output'].stdout
    restart = (f'SetEpochHook: the data policy changes at epoch '
               f'{POLICY_EPOCH}; restarting the persistent data workers.')
    assert restart in output
    assert output.count('restarting the persistent data workers') == 1
    for record in empty_rank['epochs']:
        assert record['epochs'] == [
            dict(
                epoch=epoch,
                dataset_epochs=[epoch],
                stages=[stage],
                augment_epochs=[epoch])
            for epoch, stage in zip(range(EPOCHS), [0, 0, 1])
        ]
    for rank, record in enumerate(empty_rank['recipe']):
        pids = [e['worker_pids'] for e in record['epochs']]
        assert len(pids[0]) == 2 and pids[1] == pids[0], (rank, pids)
        assert len(pids[2]) == 2 and not set(pids[2]) & set(pids[0]), rank
        resized = [e['resized_from_another_shape'] for e in record['epochs']]
        assert resized[:POLICY_EPOCH] == [0] * POLICY_EPOCH, (rank, resized)
        assert resized[POLICY_EPOCH] > 0, (rank, resized)
        mosaic_epoch = record['epochs'][POLICY_EPOCH]
        assert mosaic_epoch['mixup_calls'] == 0, rank
        assert mosaic_epoch['copy_blend_calls'] == 0, rank
    records = empty_rank['grads'][EMPTY_RANK]['records']
    gt = [step['num_gt'] for step in records]
    assert set(gt[:GT_LESS_ITERS]) == {0}
    assert sum(n > 0 for n in gt[GT_LESS_ITERS:]) > 0, gt
    mosaic_epoch = empty_rank['recipe'][EMPTY_RANK]['epochs'][POLICY_EPOCH]
    assert mosaic_epoch['matchings_with_gt_late_cost'] > 0
    print(f'\nrank {EMPTY_RANK}, Mosaic epoch {POLICY_EPOCH}: GT per batch '
          f'{gt[GT_LESS_ITERS:]}; samples resized from another shape, rank '
          '0 / 1: ' + ' / '.join(
              str(r['epochs'][POLICY_EPOCH]['resized_from_another_shape'])
              for r in empty_rank['recipe']))


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


@pytest.mark.parametrize('checkpoint, max_epochs, stage',
                         [('epoch_2.pth', EPOCHS, 1),
                          ('epoch_3.pth', EPOCHS + 1, 3)])
def test_resume_restores_ema_and_policy_epoch_from_the_checkpoint(
        empty_rank, tmp_path, checkpoint, max_epochs, stage):
    """A Runner resumed in this process from the run's checkpoint before
    the policy switch (``epoch_2.pth``, saved after epoch 1 of stage 0)
    and from the one after it (``epoch_3.pth``, the run extended by an
    epoch): its EMA is the checkpoint's average (weights and update count,
    not a copy of the model, whose weights the checkpoint holds apart),
    and the policy, batch augments and matcher start at the checkpoint's
    epoch (stage 1, the Mosaic stage, at epoch 2; stage 3 at epoch 3; the
    matcher changed and Copy-Blend's window, epoch 1 only, over at
    both)."""
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
    assert state['copy_blend_window'] is False
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
