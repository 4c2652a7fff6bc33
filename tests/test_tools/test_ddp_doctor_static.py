"""DDP doctor parts that need no probe: one test per static check, each
with a case where it fires and one where it does not; the DDP set-up it
reads; --shrink; the CPU twins (one small gloo run)."""
import json
import os.path as osp
import shutil

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


def _static(cfg, name=None):
    """The static report of ``cfg`` (no probe)."""
    from mmddp_ext.doctor import run_doctor
    report = run_doctor(cfg, 'x', dynamic=False)
    return report if name is None else report.find(*name)


def _copy_data(tmp_path, root):
    copy = str(tmp_path / 'data')
    shutil.copytree(root, copy)
    return copy


def _edit_annotations(root, edit):
    path = osp.join(root, 'train', 'annotations.json')
    with open(path) as f:
        data = json.load(f)
    edit(data)
    with open(path, 'w') as f:
        json.dump(data, f)


# ------------------------------------------------------------ dataset
def test_classes_outnumber_head(synthetic_root):
    """Three dataset classes, a head with two: blocker naming the key and
    the --cfg-options to paste; the unchanged config is ok (control)."""
    three = {
        f'{s}_dataloader.dataset.metainfo.classes': THREE_CLASSES
        for s in ('train', 'val', 'test')
    }
    report = _static(_cfg(OPT_IN, synthetic_root, **three))
    check = report.find('dataset', 'classes vs num_classes')
    assert check.verdict == 'blocker', check
    assert 'model.bbox_head.num_classes=2' in check.summary
    assert check.fix[0].startswith(
        '--cfg-options model.bbox_head.num_classes=3')
    assert report.exit_code == 1

    control = _static(_cfg(OPT_IN, synthetic_root))
    assert control.find('dataset', 'classes vs num_classes').verdict == 'ok'
    assert control.find('dataset', 'annotation files').verdict == 'ok'
    per_rank = control.find('dataset', 'images per rank')
    assert per_rank.details['per_rank'] == 12  # 24 images, 2 ranks


def test_broken_annotation_file_stops_before_the_probe(
        tmp_path, synthetic_root):
    from mmddp_ext.doctor import run_doctor
    root = _copy_data(tmp_path, synthetic_root)
    with open(osp.join(root, 'train', 'annotations.json'), 'w') as f:
        f.write('{"images": [')
    report = run_doctor(_cfg(OPT_IN, root), 'x', dynamic=True)
    check = report.find('dataset', 'annotation files')
    assert check.verdict == 'blocker'
    assert 'not valid JSON' in check.summary
    assert report.find('dynamic', 'runs on every rank').verdict == 'warn'
    assert report.exit_code == 1


def test_images_without_gt_blocker_only_when_no_image_has_a_box(
        tmp_path, synthetic_root):
    root = _copy_data(tmp_path, synthetic_root)
    _edit_annotations(root, lambda data: data.update(annotations=[]))
    check = _static(_cfg(OPT_IN, root), ('dataset', 'images without GT'))
    assert check.verdict == 'blocker', check
    assert 'no training image has a box' in check.summary
    assert 'train_dataloader.dataset.ann_file=' in check.fix[0]

    control = _static(
        _cfg(OPT_IN, synthetic_root), ('dataset', 'images without GT'))
    assert control.verdict == 'ok'
    assert control.details['train']['without_gt'] == 12


def test_degenerate_boxes_are_named_with_a_fix(tmp_path, synthetic_root):
    root = _copy_data(tmp_path, synthetic_root)

    def degenerate(data):
        width = data['images'][0]['width']
        data['annotations'][0]['bbox'] = [3, 3, 0.5, 10]  # thinner than 1
        data['annotations'][1]['bbox'] = [width - 5, 0, 20, 10]  # outside

    _edit_annotations(root, degenerate)
    check = _static(_cfg(OPT_IN, root), ('dataset', 'degenerate boxes'))
    assert check.verdict == 'warn', check
    assert '1 box(es) thinner than 1 px' in check.summary
    assert '1 box(es) reach outside their image' in check.summary
    assert len(check.details['thin']) == len(check.details['outside']) == 1
    assert 'filter_empty_gt=True' in check.fix[0]

    control = _static(
        _cfg(OPT_IN, synthetic_root), ('dataset', 'degenerate boxes'))
    assert control.verdict == 'ok' and not control.fix


def test_unreadable_image_files_are_a_blocker(tmp_path, synthetic_root):
    root = _copy_data(tmp_path, synthetic_root)
    shutil.rmtree(osp.join(root, 'train', 'images'))
    report = _static(_cfg(OPT_IN, root))
    check = report.find('dataset', 'image files')
    assert check.verdict == 'blocker', check
    assert '8 of 8 sampled train images cannot be read' in check.summary
    assert 'data_prefix=dict(img=' in check.fix[0]

    control = _static(
        _cfg(OPT_IN, synthetic_root), ('dataset', 'image files'))
    assert control.verdict == 'ok'


def test_images_per_rank_arithmetic():
    from mmengine.config import Config

    from mmddp_ext.doctor.static_config import check_auto_scale_lr
    from mmddp_ext.doctor.static_dataset import check_images_per_rank
    cfg = Config(dict(train_dataloader=dict(batch_size=2),
                      auto_scale_lr=dict(enable=False, base_batch_size=16)))
    check = check_auto_scale_lr(cfg, 2)
    assert check.verdict == 'warn'
    assert '2 ranks x 2 images = 4' in check.summary
    assert '4x too high' in check.on_gpus
    assert check.fix == [
        'auto_scale_lr = dict(enable=True)  # or tools/train.py '
        '--auto-scale-lr'
    ]
    assert check_auto_scale_lr(cfg, 8).verdict == 'ok'  # 8 x 2 = 16

    files = {'train': [('train_dataloader.dataset.ann_file', 'a.json')]}
    loaded = {'a.json': dict(images=[{}] * 5, annotations=[])}
    small = Config(dict(train_dataloader=dict(batch_size=4, drop_last=True)))
    check = check_images_per_rank(small, 2, files, loaded)
    assert check.verdict == 'blocker', check
    assert check.fix == ['train_dataloader = dict(batch_size=3)']
    large = Config(dict(train_dataloader=dict(batch_size=2)))
    assert check_images_per_rank(large, 2, files, loaded).verdict == 'ok'


# ------------------------------------------------------------- config
def test_model_that_does_not_build_is_a_blocker(synthetic_root):
    report = _static(
        _cfg(OPT_IN, synthetic_root, **{'model.bbox_head.type': 'NoSuchHead'}))
    check = report.find('config', 'model builds')
    assert check.verdict == 'blocker' and 'NoSuchHead' in check.summary
    assert check.fix
    control = _static(_cfg(OPT_IN, synthetic_root))
    assert [c.name for c in control.checks].count('model builds') == 0
    assert control.find('config', 'model wrapper').verdict == 'ok'


def test_checkpointing_conflict_is_a_blocker_only_without_the_hook():
    """with_cp=True and find_unused_parameters=True: blocker naming the
    modules for stock MMDet and for the opt-in with the hook switched off;
    ok with the opt-in (CheckpointConflictHook's default policy). With the
    probe to follow, the static check warns and leaves the verdict to
    what the iterations show."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    from mmddp_ext.doctor import launch_setup
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
        check = check_checkpointing(launch_setup(cfg), model)
        verdicts[name] = check.verdict
        assert 'backbone.layer1.0' in check.details['modules'], name
        if check.verdict == 'blocker':
            assert 'ready only once' in check.on_gpus, name
            assert 'model.backbone.with_cp=False' in ' '.join(check.fix)
            probed = check_checkpointing(launch_setup(cfg), model,
                                         probed=True)
            assert probed.verdict == 'warn', probed
            assert 'dynamic/checkpointing and DDP' in probed.summary
    assert verdicts == {'stock': 'blocker', 'opt-in': 'ok',
                        'opt-in, hook off': 'blocker'}


def test_sync_bn_warns_only_for_layers_on_batch_statistics():
    """Stock ResNet BatchNorm in training mode with 2 images per rank
    warns and the paste lines are sync_bn and norm_eval; with
    norm_eval=True (the layers use running statistics) or sync_bn set,
    ok."""
    from mmdet.registry import MODELS
    from mmengine.registry import DefaultScope

    from mmddp_ext.doctor.static_config import check_sync_bn

    def check(**options):
        cfg = _cfg(STOCK_MODEL, **options)
        with DefaultScope.overwrite_default_scope('mmdet'):
            return check_sync_bn(cfg, 2, MODELS.build(cfg.model))

    noisy = check(**{'model.backbone.norm_eval': False})
    assert noisy.verdict == 'warn', noisy
    assert noisy.fix[0] == "sync_bn = 'torch'"
    assert 'norm_eval=True' in noisy.fix[1]
    frozen = check(**{'model.backbone.norm_eval': True})
    assert frozen.verdict == 'ok', frozen
    assert frozen.summary.startswith('0 BatchNorm layer(s)')
    synced = check(sync_bn='torch', **{'model.backbone.norm_eval': False})
    assert synced.verdict == 'ok' and 'CPU twin' in synced.summary


def test_unknown_mmddp_ext_cfg_key_gets_the_corrected_line():
    from mmddp_ext.doctor import launch_setup
    from mmddp_ext.doctor.static_config import check_coherence
    cfg = _cfg(OPT_IN, **{'mmddp_ext_cfg.auto_dpp': True})
    check = check_coherence(cfg, launch_setup(cfg))
    assert check.verdict == 'blocker', check
    assert "unknown key(s) ['auto_dpp']" in check.summary
    assert check.fix[0].startswith('mmddp_ext_cfg = {')
    assert "'auto_ddp': True" in check.fix[0]
    assert "'auto_dpp'" not in check.fix[0]
    assert 'refuses the config' in check.on_gpus

    control = _cfg(OPT_IN)
    assert check_coherence(control, launch_setup(control)).verdict == 'ok'
    stock = _cfg(STOCK_MODEL, mmddp_ext_cfg=dict(auto_ddp=True))
    ignored = check_coherence(stock, launch_setup(stock))
    assert ignored.verdict == 'warn', ignored
    assert ignored.fix == ["runner_type = 'ExtRunner'"]


@pytest.mark.parametrize('moved, rank_consistency, nonfinite_skip', [
    (dict(max_consecutive_skips=2), {}, dict(max_consecutive_skips=2)),
    (dict(skip_nonfinite=False, check_every=7), dict(check_every=7), None),
])
def test_skip_keys_under_rank_consistency_get_the_moved_line(
        moved, rank_consistency, nonfinite_skip):
    """The keys RankConsistencyHook no longer takes: a blocker, as ExtRunner
    refuses them, with the line that moves them to nonfinite_skip."""
    from mmddp_ext.doctor import launch_setup
    from mmddp_ext.doctor.static_config import check_coherence
    cfg = _cfg(OPT_IN, **{'mmddp_ext_cfg.rank_consistency': moved})
    check = check_coherence(cfg, launch_setup(cfg))
    assert check.verdict == 'blocker', check
    assert "mmddp_ext_cfg.rank_consistency sets ['" in check.summary
    assert (f"'rank_consistency': {rank_consistency!r}" in check.fix[0])
    assert f"'nonfinite_skip': {nonfinite_skip!r}" in check.fix[0]


def test_resolved_setup_stock_and_opt_in():
    """The doctor reads the runner's own resolver."""
    from mmddp_ext.doctor import launch_setup
    stock = launch_setup(_cfg(STOCK_MODEL))
    assert (stock.wrapper, stock.find_unused, stock.opted_in) == (
        'MMDistributedDataParallel', False, False)
    assert stock.collate['type'] == 'pseudo_collate'
    assert stock.checkpoint_policy is None and not stock.rank_consistency
    assert not any(stock.ext_cfg.values())

    opt_in = launch_setup(_cfg(OPT_IN))
    assert (opt_in.wrapper, opt_in.find_unused, opt_in.opted_in) == (
        'AutoDDP', None, True)
    assert opt_in.collate['type'] == 'empty_gt_guard_collate'
    assert opt_in.checkpoint_policy == 'non_reentrant'
    assert opt_in.rank_consistency
    assert opt_in.ext_cfg['finite_predictions'] is True

    explicit = launch_setup(_cfg(OPT_IN, find_unused_parameters=True))
    assert (explicit.wrapper, explicit.find_unused) == ('AutoDDP', True)


# -------------------------------------------------------- environment
def test_environment_checks(monkeypatch):
    """Launcher variables: none ok, a stray RANK warns, LOCAL_RANK alone
    is a blocker; the backend warns for stock MMDet without a GPU per
    rank, ok with ExtRunner; missing mmcv.ops warns."""
    import sys

    from mmddp_ext.doctor import launch_setup
    from mmddp_ext.doctor.static_env import (OTHER_LAUNCHER_VARS,
                                             TORCHRUN_VARS, check_backend,
                                             check_launcher_env,
                                             check_versions)
    for name in TORCHRUN_VARS + OTHER_LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    assert check_launcher_env().verdict == 'ok'
    monkeypatch.setenv('RANK', '0')
    stray = check_launcher_env()
    assert stray.verdict == 'warn' and stray.fix == ['unset RANK']
    monkeypatch.delenv('RANK')
    monkeypatch.setenv('LOCAL_RANK', '0')
    alone = check_launcher_env()
    assert alone.verdict == 'blocker' and alone.fix == ['unset LOCAL_RANK']

    stock, opt_in = _cfg(STOCK_MODEL), _cfg(OPT_IN)
    no_gpu = check_backend(stock, 2, launch_setup(stock))
    assert no_gpu.verdict == 'warn', no_gpu
    assert no_gpu.fix == [
        "runner_type = 'ExtRunner'  # gloo on CPU, for trying it here"
    ]
    assert check_backend(opt_in, 2, launch_setup(opt_in)).verdict == 'ok'

    assert check_versions().verdict == 'ok'
    monkeypatch.setitem(sys.modules, 'mmcv.ops', None)  # import fails
    missing = check_versions()
    assert missing.verdict == 'warn' and 'mmcv.ops' in missing.summary


def test_bad_arguments_are_refused():
    from mmddp_ext.doctor import run_doctor
    with pytest.raises(ValueError, match='iters must be a positive int'):
        run_doctor(_cfg(OPT_IN), 'x', iters=0)
    with pytest.raises(ValueError, match='nproc must be a positive int'):
        run_doctor(_cfg(OPT_IN), 'x', nproc=0)


# ------------------------------------------------------------- shrink
def test_shrink_scales_pipelines_and_batch_augments_keeps_the_model():
    """--shrink: every image size of the pipelines and of the batch
    augments down to a short side of 128 (aspect kept), the train batch
    capped at 2 and the query count at 100; the rest of the model
    untouched."""
    from mmddp_ext.doctor import shrink_config
    cfg = _cfg(
        osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                 'rtdetr_r18vd_custom.py'))
    model_before = cfg.model.copy()
    model_before.pop('data_preprocessor')
    shrink_config(cfg)
    augment = cfg.model.data_preprocessor.batch_augments[0]
    # upstream's 480, 512, ..., 640 x 3, ..., 800, by one factor
    # x 128 / 480, kept multiples of 32 as the recipe's were: 800 -> 224
    assert augment.scales[0] == 128 and augment.scales[-1] == 224
    assert all(side % 32 == 0 for side in augment.scales)
    sizes = [t['scale'] for t in cfg.train_dataloader.dataset.pipeline
             if 'scale' in t]
    assert sizes == [(128, 128)]  # was (640, 640)
    assert cfg.train_dataloader.batch_size == 2  # was 4
    assert cfg.train_dataloader.num_workers == 0
    model_after = cfg.model.copy()
    model_after.pop('data_preprocessor')
    assert (model_before.num_queries, model_after.num_queries) == (300, 50)
    model_after.num_queries = 300
    assert model_after == model_before

    lsj = _cfg(
        osp.join(REPO_ROOT, 'projects', 'CO-DETR', 'configs', 'codino',
                 'co_dino_5scale_r50_lsj_8xb2_1x_coco.py'))
    shrink_config(lsj)
    pad = lsj.model.data_preprocessor.batch_augments[0]
    assert tuple(pad['size']) == (128, 128)  # BatchFixedSizePad, was 1024
    small = _cfg(OPT_IN)
    before = small.train_dataloader.dataset.pipeline[2]['scale']
    shrink_config(small)  # already under 128: unchanged
    assert small.train_dataloader.dataset.pipeline[2]['scale'] == before


# --------------------------------------------------- lockstep, twins
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
        assert result['events'][0]['default_group'] is True
        assert 'local' not in result['events'][0]
        assert result['divergence'] == dict(
            index=1, phase='forward',
            per_rank=['<end of forward>', 'all_reduce(float32[1])'])
    # The unmatched call ran with single-process semantics.
    assert results[1]['extra'] == 10.0
    assert results[1]['events'][1]['local'] is True


def _sync_bn_forward(twin: bool):
    """SyncBatchNorm on CPU ranks, each with its own 3 images; returns the
    output, the running mean and the input gradient (or the error). On
    the CPU whatever the ranks' device (``pytest --device cuda``): the
    twin is what the doctor runs on CPU ranks."""
    import torch.distributed as dist

    from mmddp_ext.doctor.cpu_twins import sync_batch_norm_on_cpu
    torch.manual_seed(dist.get_rank())
    layer = nn.SyncBatchNorm(2, device='cpu').train()
    x = torch.randn(3, 2, 4, 4, requires_grad=True, device='cpu')
    try:
        if twin:
            with sync_batch_norm_on_cpu():
                out = layer(x)
        else:
            out = layer(x)
    except ValueError as error:
        return dict(error=str(error))
    weights = torch.arange(out.numel(), device=out.device).view_as(out)
    (out * weights).sum().backward()
    return dict(x=x.detach(), out=out.detach(), grad=x.grad,
                running_mean=layer.running_mean.clone())


def test_sync_batch_norm_twin_matches_batch_norm_over_every_rank():
    """The twin normalises with statistics over both ranks' images: the
    output, running mean and input gradient equal a BatchNorm over the
    concatenated batch. Without it, torch's SyncBatchNorm raises on CPU
    (the false blocker the probe used to report)."""
    from mmddp_ext.testing import run_on_ranks
    results = run_on_ranks(_sync_bn_forward, 2, args=(True, ), timeout=60)
    x = torch.cat([r['x'] for r in results]).requires_grad_()
    reference = nn.BatchNorm2d(2).train()
    out = reference(x)
    (out[:3] * torch.arange(out[:3].numel()).view_as(out[:3])).sum().add(
        (out[3:] * torch.arange(out[3:].numel()).view_as(out[3:])).sum()
    ).backward()
    for rank, result in enumerate(results):
        rows = slice(3 * rank, 3 * rank + 3)
        torch.testing.assert_close(result['out'], out[rows].detach())
        torch.testing.assert_close(result['grad'], x.grad[rows])
        torch.testing.assert_close(result['running_mean'],
                                   reference.running_mean)
    stock = run_on_ranks(_sync_bn_forward, 2, args=(False, ), timeout=60)
    assert all('expected input tensor to be on GPU' in r['error']
               for r in stock)


def test_amp_is_probed_as_amp_from_a_loss_scale_of_one():
    """The probe builds an AmpOptimWrapper config as ExtAmpOptimWrapper in
    the config's dtype on the CPU (what ExtRunner trains on CPU ranks),
    its dynamic scale starting at 1 (gradients of the model's own size)."""
    from mmengine.config import ConfigDict

    from mmddp_ext.doctor.cpu_twins import describe_twins
    from mmddp_ext.doctor.probe_runner import _ProbeRunnerMixin

    class Base:
        def build_optim_wrapper(self, optim_wrapper):
            return optim_wrapper

    class Probe(_ProbeRunnerMixin, Base):
        pass

    probe = Probe()
    amp = ConfigDict(type='AmpOptimWrapper', loss_scale='dynamic',
                     dtype='bfloat16', optimizer=dict(type='AdamW', lr=1e-4))
    built = probe.build_optim_wrapper(amp)
    assert built == dict(amp, type='ExtAmpOptimWrapper',
                         loss_scale=dict(init_scale=1.0))
    assert describe_twins(0, probe.doctor_precision) == [
        'AMP ran as bfloat16 autocast on the CPU (ExtAmpOptimWrapper, '
        'loss scale from 1)', 'tensors on the CPU'
    ]
    kept = ConfigDict(type='OptimWrapper', optimizer=dict(type='SGD'))
    assert probe.build_optim_wrapper(kept) is kept
    assert describe_twins(0, probe.doctor_precision) == ['tensors on the CPU']


def test_split_invariant_forward():
    from mmddp_ext.doctor.determinism import split_invariant
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Dropout(0.5),
                          nn.MultiheadAttention(4, 2, dropout=0.5)).train()
    with split_invariant(model):
        assert not any(m.training for m in model)
        assert torch.rand_like(torch.zeros(4)).eq(0.5).all()
        signs = torch.randint_like(torch.zeros(3), low=0, high=2)
        assert signs.eq(0).all()
        assert torch.randperm(4).tolist() == [0, 1, 2, 3]
        assert torch.empty(5).bernoulli_(0.3).eq(1).all()  # DropPath
        x = torch.ones(6)
        assert torch.nn.functional.dropout(x, 0.9, True) is x
    assert all(m.training for m in model)
    assert not torch.rand(64).eq(0.5).all()
    assert not torch.empty(64).bernoulli_(0.5).eq(1).all()


def test_cluster_launch_check(monkeypatch):
    """No PreemptionHook warns (stock runner, or preemption=None); inside
    a Slurm job the check names the rendezvous a --launcher slurm launch
    takes (first node, the job's port), warns about a MASTER_PORT that
    every job would share, and blocks on a node list nobody can read."""
    from mmddp_ext.doctor import launch_setup
    from mmddp_ext.doctor.static_env import check_cluster_launch
    from mmddp_ext.launch.environments import slurm_port
    for name in ('SLURM_JOB_ID', 'SLURM_STEP_NODELIST', 'SLURM_JOB_NODELIST',
                 'SLURM_STEP_ID', 'MASTER_ADDR', 'MASTER_PORT'):
        monkeypatch.delenv(name, raising=False)
    stock = check_cluster_launch(launch_setup(_cfg(STOCK_MODEL)))
    assert stock.verdict == 'warn' and 'no PreemptionHook' in stock.summary
    off = _cfg(OPT_IN)
    off.mmddp_ext_cfg = dict(off.get('mmddp_ext_cfg') or {}, preemption=None)
    assert check_cluster_launch(launch_setup(off)).verdict == 'warn'
    setup = launch_setup(_cfg(OPT_IN))
    assert check_cluster_launch(setup).verdict == 'ok'
    monkeypatch.setenv('SLURM_JOB_ID', '777')
    monkeypatch.setenv('SLURM_JOB_NODELIST', 'gpu[03-04]')
    inside = check_cluster_launch(setup)
    assert inside.verdict == 'ok'
    assert f'gpu03:{slurm_port("777")}' in inside.summary
    monkeypatch.setenv('MASTER_PORT', '29500')
    shared = check_cluster_launch(setup)
    assert shared.verdict == 'warn' and shared.fix == [
        'unset MASTER_PORT  # the port then follows the job id'
    ]
    monkeypatch.delenv('MASTER_PORT')
    monkeypatch.setenv('SLURM_JOB_NODELIST', 'gpu[03-')
    assert check_cluster_launch(setup).verdict == 'blocker'
