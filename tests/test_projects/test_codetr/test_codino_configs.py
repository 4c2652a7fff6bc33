"""The configs in projects/CO-DETR/configs/codino build and carry upstream's
hyper-parameters; the custom-data ones take their class count from
``classes`` alone. (test_state_dict_keys.py builds the 1x configs.)"""
import copy
import functools
import os
import os.path as osp
import re

import pytest

from .codetr_utils import import_project
from .regen_keys import CODINO_CONFIGS, REPO_ROOT

URL = 'https://download.openmmlab.com/mmdetection/v3.0/codetr/'
NOT_BUILT_ELSEWHERE = [
    'co_dino_5scale_r50_lsj_8xb2_3x_coco.py',
    'co_dino_5scale_swin_l_16xb1_3x_coco.py',
    'co_dino_5scale_swin_l_lsj_16xb1_3x_coco.py',
    'co_dino_5scale_r50_lsj_custom.py',
    'co_dino_5scale_swin_l_custom.py',
]


@functools.lru_cache(maxsize=None)
def _parsed(path):
    """``path`` parsed once per process (without its custom imports);
    never handed out, see ``_config``."""
    from mmengine.config import Config

    from mmddp_ext.testing import model_index_read_once
    with model_index_read_once():
        return Config.fromfile(path, import_custom_modules=False)


def _config(path):
    """The parsed config at ``path``: a deep copy of the once-parsed one,
    which a test may change freely."""
    return copy.deepcopy(_parsed(path))


def _cfg(name):
    return _config(osp.join(CODINO_CONFIGS, name))


def _state_dict_shapes(cfg) -> dict:
    """``{key: shape}`` of ``cfg``'s model, built on the meta device
    without the backbone download (what ``regen_keys.build_entries``
    builds, from a config parsed once)."""
    from mmdet.registry import MODELS

    from mmddp_ext.testing import weights_on_meta
    cfg.model.backbone.init_cfg = None
    with weights_on_meta():
        model = MODELS.build(cfg.model)
    return {
        key: tuple(value.shape)
        for key, value in model.state_dict().items()
    }


def _steps(pipeline):
    return {step['type']: step for step in pipeline}


@pytest.mark.parametrize('name', NOT_BUILT_ELSEWHERE)
def test_config_builds(name):
    import_project()
    cfg = _cfg(name)
    classes = len(cfg.get('classes', range(80)))
    entries = _state_dict_shapes(cfg)
    assert entries['query_head.cls_branches.0.weight'][0] == classes


def test_lsj_configs_have_upstream_pipeline_and_schedule():
    for name, size, epochs, drop in (
        ('co_dino_5scale_r50_lsj_8xb2_1x_coco.py', 1024, 12, 11),
        ('co_dino_5scale_r50_lsj_8xb2_3x_coco.py', 1024, 36, 30),
        ('co_dino_5scale_swin_l_lsj_16xb1_1x_coco.py', 1280, 12, 11),
        ('co_dino_5scale_swin_l_lsj_16xb1_3x_coco.py', 1280, 36, 30),
    ):
        cfg = _cfg(name)
        assert cfg.model.use_lsj is True
        assert cfg.model.data_preprocessor.batch_augments[0].size == (size,
                                                                      size)
        data = cfg.train_dataloader.dataset
        assert data.type == 'MultiImageMixDataset'
        assert data.dataset.filter_cfg.filter_empty_gt is False
        assert _steps(data.pipeline)['CopyPaste'].max_num_pasted == 100
        load = _steps(data.dataset.pipeline)
        assert load['RandomResize'].ratio_range == (0.1, 2.0)
        assert load['RandomResize'].scale == (size, size)
        assert load['RandomCrop'].crop_size == (size, size)
        assert load['Pad'].size == (size, size)
        assert _steps(cfg.test_pipeline)['Pad'].size == (size, size)
        assert cfg.train_cfg.max_epochs == epochs
        (scheduler, ) = cfg.param_scheduler
        assert scheduler.type == 'MultiStepLR'
        assert scheduler.milestones == [drop]
        assert cfg.optim_wrapper.optimizer.lr == 2e-4
        assert cfg.auto_scale_lr.base_batch_size == 16
        assert cfg.model.query_head.transformer.encoder.type == \
            'DetrTransformerEncoder'


def test_swin_l_configs_have_upstream_backbone_and_settings():
    for name, drop_path, lsj in (
        ('co_dino_5scale_swin_l_16xb1_1x_coco.py', 0.3, False),
        ('co_dino_5scale_swin_l_16xb1_3x_coco.py', 0.6, False),
        ('co_dino_5scale_swin_l_lsj_16xb1_1x_coco.py', 0.3, True),
        ('co_dino_5scale_swin_l_lsj_16xb1_3x_coco.py', 0.5, True),
        ('co_dino_5scale_swin_l_16xb1_16e_o365tococo.py', 0.3, False),
    ):
        cfg = _cfg(name)
        backbone = cfg.model.backbone
        assert backbone.type == 'SwinTransformer'
        assert (backbone.embed_dims, backbone.depths, backbone.num_heads,
                backbone.window_size) == (192, [2, 2, 18, 2], [6, 12, 24,
                                                               48], 12)
        assert backbone.drop_path_rate == drop_path
        assert cfg.model.neck.in_channels == [192, 384, 768, 1536]
        assert cfg.model.query_head.transformer.encoder.with_cp == 6
        assert cfg.model.use_lsj is lsj
        assert cfg.train_dataloader.batch_size == 1

    o365 = _cfg('co_dino_5scale_swin_l_16xb1_16e_o365tococo.py')
    assert o365.load_from.endswith('co_dino_5scale_swin_large_22e_o365-'
                                   '0a33e247.pth')
    assert o365.model.backbone.with_cp is True
    assert o365.model.query_head.dn_cfg.box_noise_scale == 0.4
    assert o365.model.query_head.dn_cfg.group_cfg.num_dn_queries == 500
    assert o365.optim_wrapper.optimizer.lr == 1e-4
    assert o365.train_cfg.max_epochs == 16
    assert o365.param_scheduler[0].milestones == [8]
    resize = o365.train_dataloader.dataset.pipeline[3].transforms[0][0]
    assert resize.scales[0] == (480, 2048) and resize.scales[-1] == (1536,
                                                                     2048)
    assert len(resize.scales) == 34
    assert _steps(o365.test_pipeline)['Resize'].scale == (2048, 1280)


@pytest.mark.parametrize('name, checkpoint', [
    ('co_dino_5scale_r50_lsj_custom.py', 'co_dino_5scale_lsj_r50_3x_coco'),
    ('co_dino_5scale_swin_l_custom.py',
     'co_dino_5scale_swin_large_16e_o365tococo'),
])
def test_custom_config_class_count_is_set_in_one_place(name, checkpoint):
    """Editing ``classes`` alone changes every head's class count."""
    from mmengine.config import Config
    with open(osp.join(CODINO_CONFIGS, name)) as f:
        text = f.read().replace("'./", f"'{CODINO_CONFIGS}/")
    edited, count = re.subn(
        r"^classes = .*$", "classes = ('cat', 'dog', 'fox')", text, flags=re.M)
    assert count == 1
    for source, classes in ((text, 2), (edited, 3)):
        cfg = Config.fromstring(source, file_format='.py')
        model = cfg.model
        assert model.query_head.num_classes == classes
        assert model.roi_head[0].bbox_head.num_classes == classes
        assert model.bbox_head[0].num_classes == classes
        # The heads are the base's, only their class count changed.
        assert model.roi_head[0].type == 'CoStandardRoIHead'
        assert model.bbox_head[0].loss_cls.type == 'FocalLoss'
        assert len(cfg.train_dataloader.dataset.metainfo.classes) == classes
    assert cfg.load_from.startswith(URL) and checkpoint in cfg.load_from
    # load_from overwrites the backbone: no ImageNet download before it
    assert cfg.model.backbone.init_cfg is None
    data = cfg.train_dataloader.dataset
    assert data.type == 'CocoDataset'
    assert data.filter_cfg.filter_empty_gt is False
    assert cfg.auto_scale_lr.base_batch_size == 16
    for pipeline in (data.pipeline, cfg.val_dataloader.dataset.pipeline):
        assert _steps(pipeline)['LoadAnnotations'].get('with_mask') in (None,
                                                                        False)


def _train_script():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'mmddp_ext_train', osp.join(REPO_ROOT, 'tools', 'train.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _scaled_lr(auto_scale_lr, world_size=2, batch_size=2):
    """The lr after MMEngine's ``Runner.scale_lr`` (2 ranks x 2 images)."""
    from types import SimpleNamespace

    import torch
    from mmengine.logging import MMLogger
    from mmengine.optim import OptimWrapper
    from mmengine.runner import Runner
    wrapper = OptimWrapper(
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=2e-4))
    runner = SimpleNamespace(
        _train_dataloader=dict(batch_size=batch_size),
        world_size=world_size,
        param_schedulers=None,
        logger=MMLogger.get_instance('mmddp_ext_test_scale_lr'))
    Runner.scale_lr(runner, wrapper, auto_scale_lr)
    return wrapper.optimizer.param_groups[0]['lr']


def test_auto_scale_lr_with_and_without_the_flag(tmp_path):
    """``--auto-scale-lr`` scales by GPUs x batch / 16; without it the lr
    stays upstream's. Upstream's own form (``dict(base_batch_size=16)``,
    no ``enable``) works with the flag too; that form without the flag is
    what MMEngine never scales."""
    from mmengine.config import Config
    train = _train_script()
    config = osp.join(CODINO_CONFIGS, 'co_dino_5scale_r50_lsj_8xb2_1x_coco.py')
    # 'enable' written out: mmdet's own tools/train.py accepts
    # --auto-scale-lr only then (every codino config inherits this one)
    assert Config.fromfile(config).auto_scale_lr == dict(
        enable=False, base_batch_size=16)
    upstream_form = tmp_path / 'upstream_form.py'
    upstream_form.write_text(
        f'_base_ = [{config!r}]\n'
        'auto_scale_lr = dict(_delete_=True, base_batch_size=16)\n')
    for path in (config, str(upstream_form)):
        without = train.build_cfg(train.parse_args([path]))
        assert _scaled_lr(without.auto_scale_lr) == 2e-4
        with_flag = train.build_cfg(
            train.parse_args([path, '--auto-scale-lr']))
        assert with_flag.auto_scale_lr == dict(enable=True, base_batch_size=16)
        assert _scaled_lr(with_flag.auto_scale_lr) == pytest.approx(5e-5)
    assert 'enable' not in train.build_cfg(
        train.parse_args([str(upstream_form)])).auto_scale_lr
    no_key = tmp_path / 'no_key.py'
    no_key.write_text(f'_base_ = [{config!r}]\nauto_scale_lr = None\n')
    with pytest.raises(ValueError, match='needs auto_scale_lr = dict'):
        train.build_cfg(train.parse_args([str(no_key), '--auto-scale-lr']))


# Sense-X/Co-DETR @ 26653521e47157fdd819e764b4bb949057ea9f3b,
# projects/configs/co_dino/co_dino_5scale_r50_1x_coco.py line 52 (and every
# co_dino config there): sync_cls_avg_factor=True. MMDetection's 3.x copy
# omits it (DETRHead's default False).
UPSTREAM_SYNC_CLS_AVG_FACTOR = True
SHIPPED_CO_DINO = [
    osp.join(CODINO_CONFIGS, name)
    for name in sorted(os.listdir(CODINO_CONFIGS)) if name.endswith('.py')
] + [
    osp.join(REPO_ROOT, 'configs', name)
    for name in ('co_dino_ext.py', 'co_dino_ext_custom.py',
                 'co_dino_tiny.py')
]


@pytest.mark.parametrize(
    'path', SHIPPED_CO_DINO, ids=[osp.basename(p) for p in SHIPPED_CO_DINO])
def test_classification_loss_is_normalised_over_ranks_as_upstream(path):
    """Without it each rank divides its classification loss by its own box
    count: the classic DDP normalisation bug, which the doctor's gradient
    comparison reports as a blocker on co_dino_ext.py."""
    cfg = _config(path)
    assert (cfg.model.query_head.sync_cls_avg_factor is
            UPSTREAM_SYNC_CLS_AVG_FACTOR)
