"""DDP doctor parts that need no probe: static checks, the DDP set-up it
predicts, the lockstep collective recorder (one small gloo run) and the
split-invariant forward used by the gradient comparison."""
import os.path as osp

import pytest
import torch
import torch.nn as nn

from tests.helpers import REPO_ROOT, data_overrides

OPT_IN = osp.join(REPO_ROOT, 'configs', 'dino_tiny.py')
STOCK_MODEL = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                       'dino_tiny.py')
THREE_CLASSES = ('square', 'disc', 'triangle')


def _cfg(path, root=None, **options):
    from mmengine.config import Config
    cfg = Config.fromfile(path)
    if root:
        cfg.merge_from_dict(data_overrides(root))
    cfg.merge_from_dict(options)
    return cfg


def test_classes_outnumber_head(synthetic_root):
    """Three dataset classes, a head with two: blocker naming the key; the
    unchanged config is ok (control)."""
    from mmddp_ext.doctor import run_doctor
    three = {
        f'{s}_dataloader.dataset.metainfo.classes': THREE_CLASSES
        for s in ('train', 'val', 'test')
    }
    report = run_doctor(
        _cfg(OPT_IN, synthetic_root, **three), 'x', dynamic=False)
    check = report.find('dataset', 'classes vs num_classes')
    assert check.verdict == 'blocker', check
    assert 'model.bbox_head.num_classes=2' in check.summary
    assert report.exit_code == 1

    control = run_doctor(_cfg(OPT_IN, synthetic_root), 'x', dynamic=False)
    assert control.find('dataset', 'classes vs num_classes').verdict == 'ok'
    assert control.find('dataset', 'annotation files').verdict == 'ok'
    per_rank = control.find('dataset', 'images per rank')
    assert per_rank.details['per_rank'] == 12  # 24 images, 2 ranks


def test_broken_annotation_file_stops_before_the_probe(tmp_path,
                                                      synthetic_root):
    import shutil
    root = str(tmp_path / 'data')
    shutil.copytree(synthetic_root, root)
    with open(osp.join(root, 'train', 'annotations.json'), 'w') as f:
        f.write('{"images": [')
    from mmddp_ext.doctor import run_doctor
    report = run_doctor(_cfg(OPT_IN, root), 'x', dynamic=True)
    check = report.find('dataset', 'annotation files')
    assert check.verdict == 'blocker'
    assert 'not valid JSON' in check.summary
    assert report.find('dynamic', 'runs on every rank').verdict == 'warn'
    assert report.exit_code == 1


def test_resolved_setup_stock_and_opt_in():
    from mmddp_ext.doctor import resolve_setup
    stock = resolve_setup(_cfg(STOCK_MODEL))
    assert (stock.wrapper, stock.find_unused, stock.opted_in) == (
        'MMDistributedDataParallel', False, False)
    assert stock.collate['type'] == 'pseudo_collate'
    assert stock.checkpoint_policy is None and not stock.rank_consistency
    assert not any(stock.ext_cfg.values())  # finite_predictions too

    opt_in = resolve_setup(_cfg(OPT_IN))
    assert (opt_in.wrapper, opt_in.find_unused, opt_in.opted_in) == (
        'AutoDDP', None, True)
    assert opt_in.collate['type'] == 'empty_gt_guard_collate'
    assert opt_in.checkpoint_policy == 'non_reentrant'
    assert opt_in.rank_consistency
    assert opt_in.ext_cfg['finite_predictions'] is True

    explicit = resolve_setup(_cfg(OPT_IN, find_unused_parameters=True))
    assert (explicit.wrapper, explicit.find_unused) == ('AutoDDP', True)


def test_auto_scale_lr_and_images_per_rank_arithmetic():
    from mmengine.config import Config

    from mmddp_ext.doctor.static_config import check_auto_scale_lr
    cfg = Config(dict(train_dataloader=dict(batch_size=2),
                      auto_scale_lr=dict(enable=False, base_batch_size=16)))
    check = check_auto_scale_lr(cfg, 2)
    assert check.verdict == 'warn'
    assert '2 ranks x 2 images = 4' in check.summary
    assert '4x too high' in check.on_gpus
    assert check_auto_scale_lr(cfg, 8).verdict == 'ok'  # 8 x 2 = 16


def test_bad_arguments_are_refused():
    from mmddp_ext.doctor import run_doctor
    with pytest.raises(ValueError, match='iters must be a positive int'):
        run_doctor(_cfg(OPT_IN), 'x', iters=0)
    with pytest.raises(ValueError, match='nproc must be a positive int'):
        run_doctor(_cfg(OPT_IN), 'x', nproc=0)


def _diverging_rank(extra_on_rank: int):
    """Rank ``extra_on_rank`` issues one all_reduce more than its peers."""
    import torch.distributed as dist

    from mmddp_ext.doctor.collectives import CollectiveRecorder
    rank = dist.get_rank()
    recorder = CollectiveRecorder(dist.new_group(backend='gloo'))
    recorder.start_iteration()
    first = torch.tensor([float(rank + 1)])
    extra = torch.tensor([10.0])
    with recorder.recording('forward'):
        dist.all_reduce(first)
        if rank == extra_on_rank:
            dist.all_reduce(extra)
    return dict(first=first.item(), extra=extra.item(),
                events=recorder.events, divergence=recorder.divergence)


def test_recorder_reports_an_extra_collective_instead_of_hanging():
    from mmddp_ext.testing import run_on_ranks
    results = run_on_ranks(_diverging_rank, 2, args=(1, ), timeout=60)
    for rank, result in enumerate(results):
        # The matching call ran for real on every rank.
        assert result['first'] == 3.0
        assert result['events'][0]['call'] == 'all_reduce(float32[1])'
        assert 'local' not in result['events'][0]
        assert result['divergence'] == dict(
            index=1, phase='forward',
            per_rank=['<end of forward>', 'all_reduce(float32[1])'])
    # The unmatched call ran with single-process semantics.
    assert results[1]['extra'] == 10.0
    assert results[1]['events'][1]['local'] is True


def test_split_invariant_forward():
    from mmddp_ext.doctor.determinism import split_invariant
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Dropout(0.5)).train()
    with split_invariant(model):
        assert not model[0].training and not model[1].training
        assert torch.rand_like(torch.zeros(4)).eq(0.5).all()
        signs = torch.randint_like(torch.zeros(3), low=0, high=2)
        assert signs.eq(0).all()
        assert torch.randperm(4).tolist() == [0, 1, 2, 3]
    assert model[0].training and model[1].training
    assert not torch.rand(64).eq(0.5).all()


def _record(k, no_grad=(), keys=('loss_cls', ), gt=2):
    return dict(iteration=k, kind='k', gt_boxes=gt, loss_keys=list(keys),
                error=None, nonfinite_losses=[], nonfinite_grads=[],
                hidden_from_ddp=[], collectives=[], divergence=None,
                no_grad=list(no_grad), step_time_s=1.0, peak_memory_mb=1.0)


@pytest.mark.parametrize('wrapper,find_unused,verdict,text', [
    ('MMDistributedDataParallel', False, 'blocker', 'NCCL hangs in '
     'iteration 1'),
    ('AutoDDP', None, 'blocker', 'AutoDDP (static after its first step) '
     'stops rank 1 in iteration 1'),
    ('MMDistributedDataParallel', True, 'ok', 'find_unused_parameters=True'),
])
def test_usage_prediction_per_wrapper(wrapper, find_unused, verdict, text):
    """A parameter that rank 1 leaves without gradient in iteration 1: a
    hang with stock DDP, AutoDDP's error on its fast path, fine with
    find_unused_parameters=True."""
    from mmddp_ext.doctor.ddp_setup import DDPSetup
    from mmddp_ext.doctor.dynamic_checks import check_usage
    setup = DDPSetup('Runner', False, {}, wrapper, wrapper == 'AutoDDP',
                     find_unused, None, False)
    iters = [[_record(0), _record(0)],
             [_record(1), _record(1, no_grad=['head.w'], gt=0)]]
    check = check_usage(iters, setup, ['head.w', 'head.b'])
    assert check.verdict == verdict, check
    assert text in check.summary + check.on_gpus
    if verdict == 'blocker':
        assert (check.details['iteration'], check.details['rank']) == (1, 1)
        assert check.details['parameters'] == ['head.w']
        assert any('DDPSafeDINOHead' in line for line in check.fix)


def test_probe_failure_names_the_rank_error_or_the_timeout():
    from mmddp_ext.doctor.doctor import probe_failure_summary
    failed = ('2-rank run of probe_rank rank(s) [0, 1] failed\n\n'
              '===== rank 0: ValueError: the train dataset has no image '
              'with a box\nTraceback ...\n\n===== rank 1: ValueError: x\n')
    assert probe_failure_summary(failed) == (
        'the probe failed: 2-rank run of probe_rank rank(s) [0, 1] failed: '
        'ValueError: the train dataset has no image with a box')
    timed_out = ('2-rank run of probe_rank timed out after 600s\n\n'
                 '===== rank 0: no result (exit code -9)\n')
    summary = probe_failure_summary(timed_out)
    assert summary.endswith('(on a busy machine, raise --timeout)')
    assert 'no result' not in summary


def test_checkpointing_conflict_is_a_blocker_only_without_the_hook():
    """with_cp=True and find_unused_parameters=True: blocker naming the
    modules for stock MMDet and for the opt-in with the hook switched off;
    ok with the opt-in (CheckpointConflictHook's default policy)."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    from mmddp_ext.doctor import resolve_setup
    from mmddp_ext.doctor.static_config import check_checkpointing
    verdicts = {}
    for name, path, extra in (
        ('stock', STOCK_MODEL, {}),
        ('opt-in', OPT_IN, {}),
        ('opt-in, hook off', OPT_IN,
         {'mmddp_ext_cfg.checkpoint_conflict': None}),
    ):
        cfg = _cfg(path, find_unused_parameters=True,
                   **{'model.backbone.with_cp': True}, **extra)
        with DefaultScope.overwrite_default_scope('mmdet'):
            model = MODELS.build(cfg.model)
        check = check_checkpointing(resolve_setup(cfg), model)
        verdicts[name] = check.verdict
        assert 'backbone.layer1.0' in check.details['modules'], name
        if check.verdict == 'blocker':
            assert 'ready only once' in check.on_gpus, name
            assert 'model.backbone.with_cp=False' in ' '.join(check.fix)
    assert verdicts == {'stock': 'blocker', 'opt-in': 'ok',
                        'opt-in, hook off': 'blocker'}
