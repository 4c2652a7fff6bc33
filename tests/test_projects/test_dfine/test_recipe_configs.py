"""Every D-FINE zoo config (COCO and custom, N/S/M/L/X) carries upstream
D-FINE's recipe: per-parameter lr, weight decay and betas, the lr of every
group iteration by iteration, EMA, the augmentation stop epoch,
multi-scale sizes, epochs, batch size, grad clip, AMP and SyncBN.

Expected values: ``../test_deim/data/upstream_recipes.json``, what
upstream's own code makes of each YAML (Peterande/D-FINE; commit and
command in the file).
"""
import pytest

from ..test_deim import recipe_checks as checks
from ..test_deim import upstream_recipes as upstream

SIZES = ('n', 's', 'm', 'l', 'x')
CONFIGS = {
    f'projects/D-FINE/configs/dfine_hgnetv2_{size}_{kind}.py':
    f'configs/dfine/{sub}dfine_hgnetv2_{size}_{kind}.yml'
    for size in SIZES
    for kind, sub in (('coco', ''), ('custom', 'custom/'))
}
POLICY_TYPES = {'PhotoMetricDistortion', 'Expand', 'MinIoURandomCrop'}


def cases():
    for config, yml in CONFIGS.items():
        yield pytest.param(
            config,
            upstream.recipe(upstream.DFINE, yml),
            id=config.rsplit('/', 1)[-1])


@pytest.mark.parametrize('config,record', cases())
def test_every_parameter_has_upstreams_lr_weight_decay_and_betas(
        config, record):
    cfg = checks.load_config(config)
    ours = checks.port_values(cfg)
    theirs = checks.upstream_values(record)
    assert len(theirs) > 400
    diff = checks.differences(ours, theirs)
    assert not diff, (len(diff), sorted(diff.items())[:8])


@pytest.mark.parametrize('config,record', cases())
def test_lr_of_every_group_follows_upstreams_schedule(config, record):
    """LinearWarmup over 500 iterations (``LinearLR``), then constant
    (upstream's MultiStepLR milestone, epoch 500, is never reached), for
    every group, against upstream's schedulers driven as its engine
    drives them."""
    cfg = checks.load_config(config)
    checks.assert_same_lrs(
        checks.lr_trace(cfg, record), record['lr_trace']['lrs'])


@pytest.mark.parametrize('config,record', cases())
def test_ema_policy_multiscale_and_run_settings_are_upstreams(config, record):
    cfg = checks.load_config(config)
    yaml = record['yaml']
    checks.assert_upstream_ema(cfg, yaml)
    stop = checks.hook(cfg, 'RTDETRAugmentStopHook')
    # the transforms policy and the collate's multi-scale stop together
    assert stop['switch_epoch'] == yaml['policy']['epoch'] == (
        record['collate']['stop_epoch'])
    assert {op
            for op in yaml['policy']['ops']} == {
                'RandomPhotometricDistort', 'RandomZoomOut', 'RandomIoUCrop'
            }
    train_types = {t['type'] for t in cfg.train_pipeline}
    no_aug_types = {t['type'] for t in stop['switch_pipeline']}
    assert POLICY_TYPES <= train_types | {'MinIoURandomCrop'}
    assert not POLICY_TYPES & no_aug_types
    assert checks.multiscale_sizes(cfg) == record['collate']['scales']
    assert cfg.train_cfg.max_epochs == yaml['epochs']
    assert cfg.train_dataloader.batch_size * 8 == yaml['total_batch_size']
    assert cfg.train_dataloader.drop_last
    assert cfg.optim_wrapper.clip_grad.max_norm == yaml['clip_max_norm']
    assert tuple(cfg.optim_wrapper.optimizer.betas) == tuple(
        yaml['optimizer']['betas'])
    assert (cfg.optim_wrapper.type == 'AmpOptimWrapper') == yaml['use_amp']
    assert bool(cfg.get('sync_bn')) == yaml['sync_bn']


def test_port_names_miss_upstreams_regexes():
    """Negative control: without ``param_name_map`` the regexes see the
    port's names (``neck.`` for upstream's ``encoder.``, ``bbox_head.``,
    ``query_pos_head.``, ``enc_output.`` for its ``decoder.*``), and those
    norms and biases keep the weight
    decay upstream gives them 0 of."""
    config = 'projects/D-FINE/configs/dfine_hgnetv2_n_coco.py'
    cfg = checks.load_config(config)
    paramwise = cfg.optim_wrapper.paramwise_cfg.copy()
    paramwise.param_name_map = None
    ours = checks.port_values(cfg, paramwise_cfg=paramwise)
    diff = checks.differences(
        ours,
        checks.upstream_values(
            upstream.recipe(upstream.DFINE, CONFIGS[config])))
    assert {name.split('.')[0]
            for name in diff
            } == {'neck', 'bbox_head', 'query_pos_head', 'enc_output'}
    assert all(ours_[1] == 1e-4 and theirs[1] == 0.
               for ours_, theirs in diff.values())
