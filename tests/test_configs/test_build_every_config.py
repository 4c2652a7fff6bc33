"""Every config in configs/ and projects/*/configs/ builds: model, train and
val pipelines, and passes the class-count check (issue 13)."""
import os.path as osp

import pytest
from mmengine.config import Config

from mmddp_ext.testing import model_index_read_once, weights_on_meta
from ..helpers import REPO_ROOT
from .config_files import config_files, leaf_datasets


def test_the_glob_finds_the_shipped_configs():
    found = config_files()
    assert 'configs/co_dino_ext_custom.py' in found
    assert 'configs/dino_tiny.py' in found
    assert not [p for p in found if '_base_' in p]


@pytest.mark.parametrize('config', config_files())
def test_config_builds(config):
    from mmengine.dataset import Compose
    from mmengine.registry import MODELS, init_default_scope

    import mmddp_ext  # noqa: F401
    from mmddp_ext.utils import check_config_class_counts
    with model_index_read_once():  # mmdet's model index: read once
        cfg = Config.fromfile(osp.join(REPO_ROOT, config))
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    check_config_class_counts(cfg)
    # Runner refuses a split that has some of these keys but not all.
    for split in ('train', 'val', 'test'):
        keys = [f'{split}_dataloader', f'{split}_cfg']
        keys.append('optim_wrapper' if split ==
                    'train' else f'{split}_evaluator')
        assert len({cfg.get(key) is None
                    for key in keys
                    }) == 1, (f'{config}: set all or none of {keys}')
    # Parameters on the meta device: no memory, no initialisation cost
    # (a Swin-L CO-DINO has ~200M parameters), same modules and shapes.
    with weights_on_meta():
        model = MODELS.build(cfg.model)
    assert sum(p.numel() for p in model.parameters()) > 0
    for split in ('train', 'val'):
        dataset = cfg[f'{split}_dataloader'].dataset
        # A wrapper (MultiImageMixDataset) may hold a pipeline of its own.
        pipelines = [dataset.get('pipeline')] + [
            leaf.get('pipeline') for _, leaf in leaf_datasets(dataset, split)
        ]
        pipelines = [p for p in pipelines if p is not None]
        assert pipelines, f'{config}: no {split} pipeline'
        for pipeline in pipelines:
            assert len(Compose(pipeline).transforms) == len(pipeline)
