"""Every DEIM zoo config (DEIM-D-FINE N/S/M/L/X and DEIM-RTDETRv2
r18vd/r34vd/r50vd-m/r50vd/r101vd, COCO and custom) carries upstream
DEIM's recipe: per-parameter lr, weight decay and betas (and shapes), the
flat-cosine lr of every group iteration by iteration, EMA, the transforms
policy and Mosaic, the MixUp window, multi-scale sizes and stop epoch,
the model changes (unfrozen backbone, SiLU, MAL; RT-DETRv2's 'as_reg'
query position head), epochs, batch size, grad clip, AMP and SyncBN.

Expected values: ``data/upstream_recipes.json``, what upstream DEIM's own
code makes of each YAML (ShihuaHuang95/DEIM; commit and command in the
file). Custom configs follow the COCO recipe (upstream has none of its
own for DEIM: its README trains custom data with the COCO YAMLs).
"""
import pytest

from . import recipe_checks as checks
from . import upstream_recipes as upstream

SIZES = ('n', 's', 'm', 'l', 'x')
CONFIGS = {
    f'projects/DEIM/configs/deim_hgnetv2_{size}_{kind}.py':
    f'configs/deim_dfine/deim_hgnetv2_{size}_coco.yml'
    for size in SIZES
    for kind in ('coco', 'custom')
}
# DEIM-RTDETRv2: this port's size name -> upstream DEIM's YAML stem
RT_SIZES = {
    'r18vd': 'r18vd_120e',
    'r34vd': 'r34vd_120e',
    'r50vd_m': 'r50vd_m_60e',
    'r50vd': 'r50vd_60e',
    'r101vd': 'r101vd_60e',
}
CONFIGS.update({
    f'projects/DEIM/configs/deim_rtdetrv2_{size}_{kind}.py':
    f'configs/deim_rtdetrv2/deim_{stem}_coco.yml'
    for size, stem in RT_SIZES.items()
    for kind in ('coco', 'custom')
})
# upstream transform class -> this port's pipeline type
PORT_TYPES = {
    'Mosaic': 'DEIMMosaic',
    'RandomPhotometricDistort': 'PhotoMetricDistortion',
    'RandomZoomOut': 'Expand',
    'RandomIoUCrop': 'RandomIoUCrop',
    'RandomHorizontalFlip': 'RandomFlip',
    'Resize': 'Resize',
}


def cases():
    for config, yml in CONFIGS.items():
        yield pytest.param(
            config,
            upstream.recipe(upstream.DEIM, yml),
            id=config.rsplit('/', 1)[-1])


def converter(config: str) -> str:
    """The converter of the config's model family."""
    return 'rtdetr' if 'rtdetrv2' in config else 'dfine'


@pytest.mark.parametrize('config,record', cases())
def test_every_parameter_has_upstreams_lr_weight_decay_and_betas(
        config, record):
    cfg = checks.load_config(config)
    theirs = checks.upstream_values(record, converter(config))
    assert len(theirs) > 300
    diff = checks.differences(checks.port_values(cfg), theirs)
    assert not diff, (len(diff), sorted(diff.items())[:8])
    if config.endswith('_coco.py'):  # custom: another class count
        assert checks.port_shapes(cfg) == checks.upstream_shapes(
            record, converter(config))


@pytest.mark.parametrize('config,record', cases())
def test_flat_cosine_lr_of_every_group_is_upstreams(config, record):
    cfg = checks.load_config(config)
    checks.assert_same_lrs(
        checks.lr_trace(cfg, record), record['lr_trace']['lrs'])


@pytest.mark.parametrize('config,record', cases())
def test_data_policy_mixup_and_multiscale_are_upstreams(config, record):
    cfg = checks.load_config(config)
    yaml, collate = record['yaml'], record['collate']
    dataset = cfg.train_dataloader.dataset
    assert dataset.type == 'EpochPolicyDataset'
    assert dataset.policy.epoch == yaml['policy']['epoch']
    assert dataset.policy.ops == [
        PORT_TYPES[op] for op in yaml['policy']['ops']
    ]
    assert dataset.mosaic_prob == yaml['mosaic_prob']
    assert set(dataset.get(
        'mosaic_excludes',
        ('Expand', 'RandomIoUCrop'))) == {'Expand', 'RandomIoUCrop'}
    ops = [
        PORT_TYPES[op['type']] for op in yaml['ops']
        if op['type'] in PORT_TYPES
    ]
    assert [t.type for t in dataset.pipeline
            if t.type in PORT_TYPES.values()] == ops
    mosaic_op = next(op for op in yaml['ops'] if op['type'] == 'Mosaic')
    mosaic = dataset.pipeline[0]
    assert mosaic.type == 'DEIMMosaic' and not mosaic_op['use_cache']
    assert (mosaic.output_size, mosaic.rotation_range,
            list(mosaic.translation_range), list(mosaic.scaling_range),
            mosaic.fill_value) == (mosaic_op['output_size'],
                                   mosaic_op['rotation_range'],
                                   mosaic_op['translation_range'],
                                   mosaic_op['scaling_range'],
                                   mosaic_op['fill_value'])
    assert mosaic_op['probability'] == mosaic.get('prob', 1.0)
    augment, = cfg.model.data_preprocessor.batch_augments
    assert augment.type == 'CollateBatchAugment'
    if 'error' in collate:
        # upstream's YAML cannot build its collate function (r18vd:
        # RT-DETRv2's ``scales: ~``); the YAML's values, single scale
        assert 'scales' in collate['error']
        collate = dict(yaml['collate_fn'], scales=None)
    assert augment.mixup_prob == collate['mixup_prob']
    assert list(augment.mixup_epochs) == collate['mixup_epochs']
    assert augment.stop_epoch == collate['stop_epoch']
    assert checks.multiscale_sizes(cfg) == collate['scales']
    assert checks.hook(cfg, 'SetEpochHook')


@pytest.mark.parametrize('config,record', cases())
def test_model_changes_and_run_settings_are_upstreams(config, record):
    cfg = checks.load_config(config)
    yaml = record['yaml']
    checks.assert_upstream_ema(cfg, yaml)
    criterion = yaml['criterion']
    weights = criterion['weight_dict']
    head = cfg.model.bbox_head
    assert head.loss_cls == dict(
        type='MatchabilityAwareLoss',
        gamma=criterion['gamma'],
        loss_weight=weights['loss_mal'])
    assert head.loss_bbox.loss_weight == weights['loss_bbox']
    assert head.loss_iou.loss_weight == weights['loss_giou']
    decoder = yaml['model_parts']['decoder']
    assert cfg.model.decoder.layer_cfg.activation == decoder['activation']
    assert cfg.model.mlp_act == decoder['mlp_act']
    assert cfg.model.decoder.num_layers == decoder['num_layers']
    backbone = yaml['model_parts']['backbone']
    if converter(config) == 'rtdetr':
        # RT-DETRv2's criterion (per-layer matching): use_uni_set False
        assert criterion['losses'] == ['mal', 'boxes']
        assert criterion['use_uni_set'] is False
        assert head.type == 'RTDETRHead'
        assert cfg.model.type == 'DEIMRTDETR'
        assert cfg.model.query_pos_method == decoder['query_pos_method']
        assert cfg.model.decoder.get('eval_idx', -1) % decoder[
            'num_layers'] == decoder['eval_idx'] % decoder['num_layers']
        assert (cfg.model.backbone.frozen_stages,
                cfg.model.backbone.norm_cfg.requires_grad,
                cfg.model.backbone.norm_eval) == (backbone['freeze_at'],
                                                  not backbone['freeze_norm'],
                                                  backbone['freeze_norm'])
    else:
        assert criterion['losses'] == ['mal', 'boxes', 'local']
        assert head.type == 'DEIMHead'
        assert head.loss_fgl.loss_weight == weights['loss_fgl']
        assert head.loss_ddf.loss_weight == weights['loss_ddf']
        assert (cfg.model.backbone.frozen_stages,
                cfg.model.backbone.freeze_norm) == (backbone['freeze_at'],
                                                    backbone['freeze_norm'])
    assert cfg.train_cfg.max_epochs == yaml['epochs']
    assert cfg.train_dataloader.batch_size * 8 == yaml['total_batch_size']
    assert cfg.optim_wrapper.clip_grad.max_norm == yaml['clip_max_norm']
    assert tuple(cfg.optim_wrapper.optimizer.betas) == tuple(
        yaml['optimizer']['betas'])
    assert (cfg.optim_wrapper.type == 'AmpOptimWrapper') == yaml['use_amp']
    assert bool(cfg.get('sync_bn')) == yaml['sync_bn']


@pytest.mark.parametrize('size', ['n', 'l'])
def test_upstream_layout_converts_and_loads_into_the_deim_config(size):
    """Upstream's key layout (the D-FINE manifests: DEIM-D-FINE has the
    same keys and shapes) converts for the DEIM COCO config of the same
    size, shapes checked, and loads strictly; L's backbone norms, frozen
    in D-FINE's layout, are trained in DEIM's and get their counters."""
    from mmddp_ext.utils import build_reference_model
    from ..test_dfine.test_convert_dfine_checkpoint import synthetic_checkpoint
    dfine = checks.import_dfine()
    model = build_reference_model(
        checks.osp.join(checks.REPO_ROOT, 'projects', 'DEIM', 'configs',
                        f'deim_hgnetv2_{size}_coco.py'))
    assert type(model.bbox_head).__name__ == 'DEIMHead'
    assert all(p.requires_grad for p in model.backbone.parameters())
    converted = dfine.convert_dfine_state_dict(
        synthetic_checkpoint(size),
        model.state_dict(),
        dfine.decoder_num_points(model),
        log=lambda line: None)
    model.load_state_dict(converted, strict=True)
