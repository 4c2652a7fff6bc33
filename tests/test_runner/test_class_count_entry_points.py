"""A 3-class dataset against the 2-class tiny CO-DINO stops at start-up,
naming every head key, on every entry point (issue 13)."""
import json
import os.path as osp
import sys
import threading

import pytest

import mmddp_ext
from mmddp_ext.testing import free_port, make_synthetic_coco, run_command

from ..helpers import REPO_ROOT, data_overrides

CO_DINO_TINY = osp.join(REPO_ROOT, 'configs', 'co_dino_tiny.py')
THREE = ('square', 'disc', 'triangle')
HEAD_KEYS = ('model.query_head.num_classes=2',
             'model.roi_head[0].bbox_head.num_classes=2',
             'model.bbox_head[0].num_classes=2')


@pytest.fixture(scope='module')
def three_class_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('three_classes'))
    for split, seed in (('train', 0), ('val', 1)):
        make_synthetic_coco(
            osp.join(root, split),
            num_images=4,
            classes=THREE,
            empty='none',
            seed=seed)
    return root


def three_class_overrides(root):
    overrides = data_overrides(root)
    for split in ('train', 'val', 'test'):
        overrides[f'{split}_dataloader.dataset.metainfo.classes'] = THREE
    return overrides


def _mmdet_train_py():
    import mmdet
    return osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools', 'train.py')


def _commands(root, tmp_path):
    options = ['--cfg-options'] + [
        f'{key}=({",".join(value)})'
        if isinstance(value, tuple) else f'{key}={value}'
        for key, value in three_class_overrides(root).items()
    ]
    checkpoint = tmp_path / 'unused.pth'
    checkpoint.write_bytes(b'')
    work = ['--work-dir', str(tmp_path / 'work')]
    return {
        'tools/train.py': [
            sys.executable,
            osp.join(REPO_ROOT, 'tools', 'train.py'), CO_DINO_TINY, *work,
            *options
        ],
        'tools/test.py': [
            sys.executable,
            osp.join(REPO_ROOT, 'tools', 'test.py'), CO_DINO_TINY,
            str(checkpoint), *work, *options
        ],
        'mmdet tools/train.py':
        [sys.executable,
         _mmdet_train_py(), CO_DINO_TINY, *work, *options],
        'tools/dist_train.sh 2 ranks': [
            'bash',
            osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), CO_DINO_TINY, '2',
            *work, *options
        ],
    }


def test_mismatch_stops_at_start_up_on_every_entry_point(
        three_class_root, tmp_path):
    """The four entry points run side by side (each mostly imports)."""
    results = {}

    def run(entry, cmd):
        results[entry] = run_command(
            cmd,
            timeout=150,
            cwd=REPO_ROOT,
            env={
                'PYTHONPATH': REPO_ROOT,
                'PORT': str(free_port()),
                'PYTHON': sys.executable
            },
            check=False)

    threads = [
        threading.Thread(target=run, args=item)
        for item in _commands(three_class_root, tmp_path).items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4
    for entry, result in results.items():
        out = result.stdout
        assert result.returncode != 0, f'{entry}:\n{out[-3000:]}'
        assert 'ValueError: ' in out and 'the dataset has 3 classes' in out, \
            f'{entry}:\n{out[-3000:]}'
        for key in HEAD_KEYS:
            assert key in out, entry
        # Stopped before the runner was built: no hooks listed, no model.
        assert 'Hooks will be executed' not in out, entry
    # Every rank of the 2-rank launch reports it (each rank's traceback is
    # in the launcher's output).
    out = results['tools/dist_train.sh 2 ranks'].stdout
    assert 'rank 0 of 2 stops' in out and 'rank 1 of 2 stops' in out


def test_without_the_check_training_crashes_deep_inside(
        three_class_root, tmp_path, monkeypatch):
    """Negative control: with the check switched off, the first step with
    a 'triangle' box fails inside CO-DINO's denoising label embedding, as
    users saw it."""
    with open(osp.join(three_class_root, 'train', 'annotations.json')) as f:
        labels = {ann['category_id'] for ann in json.load(f)['annotations']}
    assert len(labels) == 3  # the batch holds class index 2
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    monkeypatch.setattr(mmddp_ext.ExtRunner, '_check_class_counts',
                        lambda self, *args, **kwargs: None)
    monkeypatch.setattr(mmddp_ext.ExtRunner,
                        '_raise_class_count_error_together', lambda self: None)
    cfg = Config.fromfile(CO_DINO_TINY)
    cfg.merge_from_dict(three_class_overrides(three_class_root))
    cfg.merge_from_dict({
        'train_dataloader.batch_size': 4,
        'train_dataloader.sampler.shuffle': False,
        'train_cfg.max_iters': 1,
        'default_hooks.checkpoint': None,
        'val_dataloader': None,
        'val_cfg': None,
        'val_evaluator': None,
    })
    cfg.work_dir = str(tmp_path / 'work')
    runner = RUNNERS.build(cfg)
    with pytest.raises(IndexError, match='index out of range'):
        runner.train()


def test_tools_check_other_runners_themselves(three_class_root):
    """tools/train.py and tools/test.py check before building a runner
    that is not an ExtRunner (ExtRunner checks itself, on every rank)."""
    from mmengine.config import Config
    sys.path.insert(0, osp.join(REPO_ROOT, 'tools'))
    try:
        from train import check_class_counts_unless_ext_runner
    finally:
        sys.path.remove(osp.join(REPO_ROOT, 'tools'))
    cfg = Config.fromfile(CO_DINO_TINY)
    cfg.merge_from_dict(three_class_overrides(three_class_root))
    check_class_counts_unless_ext_runner(cfg, ('train', ))  # ExtRunner's
    cfg.runner_type = 'Runner'
    with pytest.raises(ValueError, match='the dataset has 3 classes'):
        check_class_counts_unless_ext_runner(cfg, ('test', ))
