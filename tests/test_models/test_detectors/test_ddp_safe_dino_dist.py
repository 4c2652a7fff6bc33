"""DDPSafeDINO on 2 and 3 real gloo ranks, one of which only ever sees
GT-less images, with ``find_unused_parameters=False``.

Each world size launches its ranks once when all goes well
(``_dist_runs``): every rank runs two DDP steps of the tiny model on a
fixed batch, then trains a stock mmdet DINO config that has only the
documented opt-in lines added (plus tiny overrides) with the Runner. The
tests below check different parts of what the ranks reported; a run that
fails or hangs fails only the tests that read it.
"""
import os.path as osp

import pytest

from mmddp_ext.launch.rank_launcher import FAILURE_GRACE_S, STARTUP_LIMIT_S
from mmddp_ext.testing import RunsInOneLaunch, like_a_rank, make_synthetic_coco
from ..dino_utils import (build_model, control_step_report, ddp_step_report,
                          drop_dn_padding_of_gt_less_images,
                          global_relative_error, loss_and_grads, raw_batch,
                          record_dn_meta, relative_errors, tiny_dino_cfg)

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
EMPTY_RANK = 1
# Per rank, the GT count of each of its 2 images; rank 1 has none. Ranks
# with GT share the same maximum (2), so the dynamic dn grouping
# (num_dn_queries // max GT per image) is the same on every rank with GT
# and in the single-process batch.
GT_COUNTS = {2: [[2, 1], [0, 0]], 3: [[2, 1], [0, 0], [1, 2]]}
# With an unshuffled sampler, rank r reads images r, r + W, ...
EMPTY_IMAGES = {2: 'odd', 3: 'mod3:1'}
TRAIN_ITERS = 2
# Collective timeout of the negative control's own process group: a
# mismatched collective there fails (or times out) within this bound.
CONTROL_TIMEOUT_S = 15
# Each run's limit, checked in the ranks. Measured at load 5 on 2 cores:
# 2.2-3.7 s for the DDP steps (the first run of a launch: the ranks'
# warm-up), 4.8-6.7 s for the training, under 1.5 s for the controls but
# 15.8 s for the last one (its groups' CONTROL_TIMEOUT_S).
RUN_LIMIT_S = 60
# Each launch's limit: measured 29 s (2 ranks) and 11 s (3 ranks) at load
# 5; 45 and 24 s in the suite (tests/file_durations.json).
LAUNCH_LIMIT_S = 240
# The test that starts a launch (the first to ask for one of its runs; a
# later one after a failed run; measured 7-35 s at load 2-5, 45 s in the
# suite) holds the launch's limit, the launcher's limit for starting the
# ranks, its grace for a failed rank's peers and a margin for reporting:
# above setup.cfg's 300 s.
pytestmark = pytest.mark.timeout(LAUNCH_LIMIT_S + STARTUP_LIMIT_S +
                                 FAILURE_GRACE_S + 20)

# A stock mmdet DINO config with the opt-in added: the mmddp_ext base and
# the two-line model override documented in configs/_base_/mmddp_ext.py.
OPT_IN_CONFIG = f"""
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
    '{REPO_ROOT}/configs/_base_/mmddp_ext.py',
]
model = dict(type='DDPSafeDINO', bbox_head=dict(type='DDPSafeDINOHead'))
"""


def tiny_overrides(data_root: str) -> dict:
    """Shrink the stock config for CPU and point it at synthetic data."""
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='RandomFlip', prob=0.5),
        dict(type='PackDetInputs')
    ]
    return {
        'model.num_queries':
        30,
        'model.backbone.depth':
        18,
        'model.backbone.init_cfg':
        None,  # no download
        'model.neck.in_channels': [128, 256, 512],
        'model.encoder.num_layers':
        1,
        'model.decoder.num_layers':
        2,
        'model.encoder.layer_cfg.ffn_cfg.feedforward_channels':
        128,
        'model.decoder.layer_cfg.ffn_cfg.feedforward_channels':
        128,
        'model.bbox_head.num_classes':
        2,
        'model.dn_cfg.group_cfg.num_dn_queries':
        10,
        'model.test_cfg.max_per_img':
        30,
        'model_wrapper_cfg':
        dict(type='MMDistributedDataParallel', find_unused_parameters=False),
        'train_dataloader.num_workers':
        0,
        'train_dataloader.persistent_workers':
        False,
        'train_dataloader.sampler.shuffle':
        False,
        'train_dataloader.dataset.data_root':
        data_root + '/',
        'train_dataloader.dataset.ann_file':
        'train/annotations.json',
        'train_dataloader.dataset.data_prefix':
        dict(img='train/images/'),
        'train_dataloader.dataset.metainfo':
        dict(classes=('square', 'disc')),
        'train_dataloader.dataset.pipeline':
        pipeline,
        'train_cfg.max_epochs':
        1,
        'val_cfg':
        None,
        'val_dataloader':
        None,
        'val_evaluator':
        None,
        'test_cfg':
        None,
        'test_dataloader':
        None,
        'test_evaluator':
        None,
        'default_hooks.checkpoint':
        None,
    }


class _GtCountRecorder:
    """Hook mixin: GT boxes per image of every training batch."""

    def __init__(self):
        self.gt_counts = []

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.gt_counts.append(
            [len(s.gt_instances) for s in data_batch['data_samples']])


def _train_opt_in_config(config_path, data_root, work_dir):
    """Train the opt-in config; report what this rank logged and saw."""
    from mmengine.config import Config
    from mmengine.hooks import Hook
    from mmengine.registry import RUNNERS
    cfg = Config.fromfile(config_path)
    cfg.merge_from_dict(tiny_overrides(data_root))
    cfg.work_dir = work_dir
    cfg.launcher = 'pytorch'
    runner = RUNNERS.build(cfg)
    recorder = type('GtCountRecorder', (_GtCountRecorder, Hook), {})()
    runner.register_hook(recorder)
    runner.train()
    scalars = runner.message_hub.log_scalars
    losses = {
        key[len('train/'):]: scalars[key].data[0].tolist()
        for key in scalars if key.startswith('train/') and 'loss' in key
    }
    return dict(
        iters=runner.iter,
        losses=losses,
        gt_counts=recorder.gt_counts,
        model=type(runner.model.module).__name__,
        find_unused=runner.model.find_unused_parameters)


def _ddp_steps(gt_counts, ddp_safe=True, head=None, process_group=None):
    """Two plain-DDP passes of this rank's fixed batch (see
    ``ddp_step_report``), with each pass's ``dn_meta`` and loss keys; only
    rank 0 keeps its gradients."""
    import torch.distributed as dist

    from .. import dn_skipping_heads  # noqa: F401  (registers the heads)
    rank = dist.get_rank()
    model = build_model(
        tiny_dino_cfg(ddp_safe=ddp_safe, deterministic=True, head=head))
    head_calls = record_dn_meta(model.bbox_head)
    report = ddp_step_report(
        model,
        raw_batch(gt_counts[rank], first_index=2 * rank),
        process_group=process_group)
    report['head_calls'] = head_calls
    if rank != 0:
        report['grads'] = None
    return report


def _stock_generator_with_skipping_head(gt_counts):
    """The negative control: mmdet's DINO + a head that skips an empty dn
    part, on a process group of its own with a short collective timeout
    (see ``control_step_report``). Returns the error and what the head
    saw."""
    import torch.distributed as dist

    from .. import dn_skipping_heads  # noqa: F401  (registers the heads)
    rank = dist.get_rank()
    model = build_model(
        tiny_dino_cfg(
            ddp_safe=False,
            deterministic=True,
            head='DINOHeadSkippingEmptyDn'))
    head_calls = record_dn_meta(model.bbox_head)
    outcome = control_step_report(
        model, raw_batch(gt_counts[rank], first_index=2 * rank),
        CONTROL_TIMEOUT_S)
    return dict(outcome, head_calls=head_calls)


def _dist_step(name, fn, *args):
    """One run of ``_dist_runs`` on this rank."""
    return fn(*args)


def _dist_runs(tmp_path_factory, world_size):
    """``(world size, the runs as their tests ask for them)``: on every
    rank, two DDP steps of the tiny model on a fixed batch, then the opt-in
    config trained by the Runner; on 2 ranks, the controls after them. One
    launch for all when all goes well; a run that fails or passes
    ``RUN_LIMIT_S`` fails only its own tests."""
    root = tmp_path_factory.mktemp(f'ddp_safe_dino_{world_size}')
    make_synthetic_coco(
        str(root / 'train'),
        num_images=world_size * 2 * TRAIN_ITERS,
        empty=EMPTY_IMAGES[world_size])
    config_path = root / 'dino_opt_in.py'
    config_path.write_text(OPT_IN_CONFIG)
    gt_counts = GT_COUNTS[world_size]
    runs = [
        ('steps', _ddp_steps, gt_counts),
        ('training', _train_opt_in_config, str(config_path), str(root),
         str(root / 'work')),
    ]
    if world_size == 2:  # the controls on 2 ranks only (time budget)
        runs += [
            # What the dummy group buys: a head that skips an empty dn
            # part runs the same code on every rank with the DDP-safe
            # generator...
            ('skipping_safe', _ddp_steps, gt_counts, True,
             'DDPSafeDINOHeadSkippingEmptyDn'),
            # ...mmdet's DINOHead, with no such branch, survives without
            # it...
            ('stock', _ddp_steps, gt_counts, False),
            # ...and the skipping head does not (last: it breaks its
            # groups).
            ('skipping_stock', _stock_generator_with_skipping_head,
             gt_counts),
        ]
    return world_size, RunsInOneLaunch(
        _dist_step,
        runs,
        world_size,
        results_dir=str(root / 'results'),
        run_limit_s=RUN_LIMIT_S,
        launch_limit_s=LAUNCH_LIMIT_S,
        what=f'DDPSafeDINO run on {world_size} ranks')


@pytest.fixture(scope='module')
def dist_2ranks(tmp_path_factory):
    return _dist_runs(tmp_path_factory, 2)


@pytest.fixture(scope='module')
def dist_3ranks(tmp_path_factory):
    return _dist_runs(tmp_path_factory, 3)


@pytest.fixture(params=['dist_2ranks', 'dist_3ranks'],
                ids=['2ranks', '3ranks'])
def dist_run(request):
    return request.getfixturevalue(request.param)


def test_same_loss_keys_collectives_and_gradients_on_every_rank(dist_run):
    world_size, runs = dist_run
    steps = runs.of('steps')
    assert len(steps) == world_size
    for rank, step in enumerate(steps):
        assert step['loss_keys'] == steps[0]['loss_keys'], rank
        assert step['all_reduce_calls'] == steps[0]['all_reduce_calls']
        assert step['missing_grads'] == [], rank
        assert step['grad_checksum'] == steps[0]['grad_checksum'], rank
        for key, value in step['loss_values'].items():
            assert abs(value) < float('inf'), (rank, key)  # NaN fails too
    # reduce_mean of the 2 average factors of every loss-term set: matching
    # and dn per decoder layer (2 each) and the encoder.
    assert len(steps[0]['all_reduce_calls']) == 2 * (2 + 2 + 1)
    assert 'dn_loss_cls' in steps[0]['loss_keys']


def test_ddp_gradient_equals_single_process(dist_run):
    """One DDP step equals one single-process step over the concatenated
    batch (fp32).

    Normalisation: every DINO loss term is ``sum_i l_i / A`` over the
    rank's images, with ``A`` the rank's positive count passed through
    ``reduce_mean`` (mean over ranks = N / W for N positives in all), so
    rank r's loss is ``W * sum_{i in r} l_i / N``. DDP averages gradients
    over the W ranks, giving ``grad(sum_i l_i / N)``: exactly the
    single-process gradient of the whole batch, whose ``A`` is N. BN runs
    on its running statistics and the dn noise is off
    (``deterministic=True``) so each image's loss does not depend on its
    batch; see ``drop_dn_padding_of_gt_less_images`` for the one
    batching-dependent dn term. Loss values are per rank and are not
    compared; the gradients are, as a whole (relative 1e-6) and per
    tensor (1e-5: tiny BN-bias gradients are cancelling sums).
    """
    world_size, runs = dist_run
    with like_a_rank():  # the reference on the ranks' device
        reference_model = build_model(
            tiny_dino_cfg(ddp_safe=True, deterministic=True))
        drop_dn_padding_of_gt_less_images(reference_model.bbox_head)
        all_counts = [n for rank in GT_COUNTS[world_size] for n in rank]
        _, reference = loss_and_grads(reference_model, raw_batch(all_counts))

    grads = runs.of('steps')[0]['grads']
    assert global_relative_error(grads, reference) < 1e-6
    errors = relative_errors(grads, reference)
    worst = max(errors, key=errors.get)
    assert errors[worst] < 1e-5, (worst, errors[worst])


def test_stock_dino_config_with_opt_in_trains(dist_run):
    """The stock config + opt-in builds DDPSafeDINO and trains on every
    rank without unused-parameter detection; one rank sees no GT at all;
    every rank logs the same finite losses, dn terms included."""
    world_size, runs = dist_run
    trainings = runs.of('training')
    for rank, training in enumerate(trainings):
        assert training['model'] == 'DDPSafeDINO'
        assert training['find_unused'] is False
        assert training['iters'] == TRAIN_ITERS, rank
        assert sorted(training['losses']) == sorted(trainings[0]['losses'])
        for key, history in training['losses'].items():
            assert len(history) == TRAIN_ITERS, (rank, key)
            assert all(abs(v) < float('inf') for v in history), (rank, key)
        seen = sum(map(sum, training['gt_counts']))
        assert (seen == 0) == (rank == EMPTY_RANK), (rank, seen)
    assert {'dn_loss_cls', 'd0.dn_loss_iou',
            'enc_loss_cls'} <= set(trainings[0]['losses'])


def test_gt_less_rank_gets_the_dummy_group(dist_run):
    """The mechanism, asserted on every rank: the GT-less rank's head sees
    one dummy dn group (2 queries), the others their real dn groups."""
    world_size, runs = dist_run
    for rank, step in enumerate(runs.of('steps')):
        calls = step['head_calls']
        assert len(calls) == 2, rank  # both passes
        for call in calls:
            meta = call['dn_meta']
            if rank == EMPTY_RANK:
                assert meta['dummy_dn_group'] is True
                assert meta['num_denoising_queries'] == 2
                assert meta['num_denoising_groups'] == 1
            else:
                assert meta['dummy_dn_group'] is False
                assert meta['num_denoising_queries'] > 2


def test_head_skipping_an_empty_dn_part_runs_the_same_on_every_rank(
        dist_2ranks):
    """With the dummy group, a head that skips the dn loss when there are
    no dn queries (as RT-DETR v1's criterion does) never skips it: every
    rank has the same loss keys and all-reduces, and DDP completes."""
    _, runs = dist_2ranks
    steps = runs.of('skipping_safe')
    for rank, step in enumerate(steps):
        assert step['loss_keys'] == steps[0]['loss_keys'], rank
        assert step['all_reduce_calls'] == steps[0]['all_reduce_calls']
        assert step['missing_grads'] == [], rank
        assert step['grad_checksum'] == steps[0]['grad_checksum'], rank
    assert 'dn_loss_cls' in steps[EMPTY_RANK]['loss_keys']


def test_stock_dino_head_survives_a_gt_less_rank(dist_2ranks):
    """What the dummy group does not buy: mmdet's DINO + DINOHead already
    keep the same loss keys and collectives on a GT-less rank (zero dn
    queries, empty tensors still in the graph)."""
    _, runs = dist_2ranks
    steps = runs.of('stock')
    for rank, step in enumerate(steps):
        stock_meta = step['head_calls'][0]['dn_meta']
        assert 'dummy_dn_group' not in stock_meta
        assert (stock_meta['num_denoising_queries'] == 0) == (
            rank == EMPTY_RANK)
        assert step['loss_keys'] == steps[0]['loss_keys'], rank
        assert step['all_reduce_calls'] == steps[0]['all_reduce_calls']
        assert step['missing_grads'] == [], rank


def test_stock_generator_with_skipping_head_breaks_ddp(dist_2ranks):
    """The negative control: the same skipping head with mmdet's generator.
    The GT-less rank has no dn loss keys and skips the dn all-reduces, so
    its peers wait for all-reduces that never come while it waits for
    their gradients: the hang users see, caught here by the control
    groups' collective timeout on every rank."""
    _, runs = dist_2ranks
    stock = runs.of('stock')
    controls = runs.of('skipping_stock')
    # The ranks with GT may fail inside their forward (in their extra dn
    # all-reduces), before the head's call is recorded.
    empty_keys = controls[EMPTY_RANK]['head_calls'][0]['loss_keys']
    assert not any('dn_loss' in key for key in empty_keys)
    assert 'dn_loss_cls' in stock[0]['loss_keys']
    assert controls[EMPTY_RANK]['head_calls'][0]['dn_meta'][
        'num_denoising_queries'] == 0
    for rank, control in enumerate(controls):
        assert 'Timed out waiting' in (control['error'] or ''), rank
