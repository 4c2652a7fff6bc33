"""tools/dist_train.sh end to end on real gloo ranks (CPU)."""
import os
import os.path as osp
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from mmddp_ext.testing import free_port, kill_process_tree, run_command
from mmddp_ext.utils import load_checkpoint_file
from ..helpers import (REPO_ROOT, TINY_CONFIG, coco_metrics, data_options,
                       dist_train, gt_as_predictions, logged_iters,
                       tiny_options, train_on_ranks)


def _evaluate_with_dist_test(root, ckpt_path, nproc, tmp_path):
    """tools/dist_test.sh on ``nproc`` ranks: pycocotools mAP of the
    checkpoint, one prediction per val image gathered from every rank, the
    printed mAP equal to pycocotools' mAP of the dumped predictions."""
    preds = str(tmp_path / 'preds.pkl')
    cmd = ['bash', osp.join(REPO_ROOT, 'tools', 'dist_test.sh'), TINY_CONFIG,
           ckpt_path, str(nproc), '--work-dir', str(tmp_path / 'test'),
           '--out', preds, '--cfg-options', *data_options(root)]
    result = run_command(cmd, timeout=90, cwd=REPO_ROOT,
                         env={'PORT': str(free_port()),
                              'PYTHON': sys.executable})
    found = re.search(r'coco/bbox_mAP: (-?[\d.]+)', result.stdout)
    assert found, result.stdout[-3000:]
    assert f'Load checkpoint from {ckpt_path}' in result.stdout
    with open(preds, 'rb') as f:
        predictions = pickle.load(f)
    ann_file = osp.join(root, 'val', 'annotations.json')
    assert sorted(p['img_id'] for p in predictions) == sorted(
        s['img_id'] for s in gt_as_predictions(ann_file))
    # The evaluator itself is checked by the GT-as-predictions test below.
    recomputed = coco_metrics(TINY_CONFIG, ann_file, predictions)
    assert float(found[1]) == pytest.approx(
        recomputed['coco/bbox_mAP'], abs=6e-4)
    assert 0 <= float(found[1]) <= 1  # -1: pycocotools found no GT


def test_gt_as_predictions_score_map_one(synthetic_root):
    """The evaluation path that tools/test.py uses (the config's
    CocoMetric, pycocotools) can tell right from wrong: the GT as
    predictions gives mAP 1.0; the same boxes moved by half their width
    give much less."""
    ann_file = osp.join(synthetic_root, 'val', 'annotations.json')
    perfect = coco_metrics(TINY_CONFIG, ann_file, gt_as_predictions(ann_file))
    assert perfect['coco/bbox_mAP'] == 1.0
    assert perfect['coco/bbox_mAP_50'] == 1.0
    moved = coco_metrics(TINY_CONFIG, ann_file,
                         gt_as_predictions(ann_file, shift=0.5))
    assert moved['coco/bbox_mAP'] < 0.2
    assert moved['coco/bbox_mAP_50'] < 1.0


def test_two_nodes_on_localhost(synthetic_root, tmp_path):
    port = str(free_port())
    work_dir = str(tmp_path / 'work')
    results = {}

    def node(rank):
        results[rank] = dist_train(
            TINY_CONFIG, 1, work_dir,
            data_options(synthetic_root) + tiny_options(2),
            env=dict(NNODES='2', NODE_RANK=str(rank), PORT=port,
                     MASTER_ADDR='127.0.0.1'),
            check=False)

    threads = [threading.Thread(target=node, args=(r, )) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=200)
    for rank in (0, 1):
        assert results[rank].returncode == 0, results[rank].stdout[-4000:]
    assert 'gloo process group, rank 0/2' in results[0].stdout
    assert logged_iters(results[0].stdout) == [1, 2]


def _last_checkpoint_iter(work_dir):
    path = osp.join(work_dir, 'last_checkpoint')
    if not osp.exists(path):
        return 0
    with open(path) as f:
        found = re.search(r'iter_(\d+)\.pth', f.read())
    return int(found[1]) if found else 0


def _optimizer_steps(ckpt):
    return {int(s['step']) for s in ckpt['optimizer']['state'].values()}


def test_resume_after_kill_continues(synthetic_root, tmp_path):
    """2 CPU ranks through tools/dist_train.sh, killed after a checkpoint,
    resumed with --resume to the end (tools/train.py as dist_train.sh
    starts it); the final checkpoint evaluated on 2 ranks through
    tools/dist_test.sh (3 ranks through dist_train.sh:
    test_co_dino_dist_train.py and test_rtdetr_dist.py)."""
    work_dir = str(tmp_path / 'work')
    iters = 8
    cmd = ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), TINY_CONFIG,
           '2', '--work-dir', work_dir, '--cfg-options',
           *data_options(synthetic_root), *tiny_options(iters, ckpt_every=2)]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        env=dict(os.environ, PORT=str(free_port()), PYTHON=sys.executable))
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and _last_checkpoint_iter(
            work_dir) < 4:
        time.sleep(0.2)
    kill_process_tree(proc.pid)
    proc.wait()
    # The checkpoint that --resume picks: the one `last_checkpoint` names,
    # written after the file itself is complete.
    killed_at = _last_checkpoint_iter(work_dir)
    assert killed_at >= 4, 'no checkpoint before the deadline'
    assert killed_at < iters, 'the run finished before it was killed'

    # resumed as tools/dist_train.sh starts the ranks, on ranks forked with
    # their imports done (the launch of a signalled dist_train.sh run and
    # its resume: tests/test_runner/exact_resume/test_preemption_dist.py)
    result = train_on_ranks(TINY_CONFIG, 2, work_dir,
                            data_options(synthetic_root) +
                            tiny_options(iters, ckpt_every=2),
                            extra_args=['--resume'])
    assert result.returncode == 0, result.stdout[-6000:]
    out = result.stdout
    assert 'gloo process group, rank 0/2' in out
    assert 'CUDA is not available' in out
    assert f'resumed epoch: 0, iter: {killed_at}' in out
    assert logged_iters(out) == list(range(killed_at + 1, iters + 1))
    final = load_checkpoint_file(osp.join(work_dir, f'iter_{iters}.pth'))
    assert final['meta']['iter'] == iters
    # AdamW's step count carried over: the optimizer state was resumed.
    assert _optimizer_steps(final) == {iters}
    # The logged loss history was resumed too (one entry per iteration).
    loss_history = final['message_hub']['log_scalars']['train/loss']
    assert len(loss_history['log_history']) == iters
    # Written through mmddp_ext: it loads with weights_only=True (above).
    _evaluate_with_dist_test(synthetic_root,
                             osp.join(work_dir, f'iter_{iters}.pth'), 2,
                             tmp_path)


def test_missing_config_is_refused(tmp_path):
    result = run_command(
        ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'),
         'configs/nope.py', '2'], timeout=30, check=False)
    assert result.returncode == 2
    assert "config file 'configs/nope.py' does not exist" in result.stdout


@pytest.mark.parametrize('nproc', ['two', '0', '-1'])
def test_nproc_must_be_positive_integer(nproc):
    result = run_command(
        ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), TINY_CONFIG,
         nproc], timeout=30, check=False)
    assert result.returncode == 2
    assert f"NPROC must be a positive integer (ranks per node), got " \
        f"'{nproc}'" in result.stdout


def test_invalid_coco_json_is_named(synthetic_root, tmp_path):
    root = str(tmp_path / 'data')
    shutil.copytree(synthetic_root, root)
    bad = osp.join(root, 'train', 'annotations.json')
    with open(bad, 'w') as f:
        f.write('{"images": [1, 2,')
    result = dist_train(TINY_CONFIG, 2, str(tmp_path / 'work'),
                        data_options(root) + tiny_options(2), check=False,
                        timeout=90)
    assert result.returncode != 0
    assert f'annotation file {bad} is not valid JSON' in result.stdout
    assert 'train_dataloader.dataset.ann_file' in result.stdout


def test_train_py_missing_config_message():
    result = run_command([sys.executable, osp.join(REPO_ROOT, 'tools',
                                                   'train.py'), 'nope.py'],
                         timeout=60, check=False)
    assert result.returncode != 0
    assert "config file 'nope.py' does not exist" in result.stdout


def test_test_py_missing_checkpoint_message():
    result = run_command([sys.executable, osp.join(REPO_ROOT, 'tools',
                                                   'test.py'), TINY_CONFIG,
                          'nope.pth'], timeout=60, check=False)
    assert result.returncode != 0
    assert "checkpoint file 'nope.pth' does not exist" in result.stdout


def test_dist_test_needs_three_arguments():
    result = run_command(
        ['bash', osp.join(REPO_ROOT, 'tools', 'dist_test.sh'), TINY_CONFIG,
         '2'], timeout=30, check=False)
    assert result.returncode == 2
    assert 'CONFIG, CHECKPOINT and NPROC are required' in result.stdout
