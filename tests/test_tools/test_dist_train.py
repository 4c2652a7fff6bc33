"""tools/dist_train.sh end to end on real gloo ranks (CPU)."""
import os
import os.path as osp
import pickle
import re
import shutil
import socket
import subprocess
import sys
import threading

import pytest

from mmddp_ext.testing import free_port, run_command
from mmddp_ext.utils import load_checkpoint_file
from ..helpers import (REPO_ROOT, TINY_CONFIG, coco_metrics, data_options,
                       dist_train, gt_as_predictions, logged_iters,
                       tiny_options)


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
    """tools/dist_train.sh as two nodes of one rank each (NNODES, NODE_RANK,
    MASTER_ADDR), its checkpoint evaluated through tools/dist_test.sh."""
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
    assert 'CUDA is not available' in results[0].stdout
    assert logged_iters(results[0].stdout) == [1, 2]
    # The checkpoint is written through mmddp_ext: it loads with
    # weights_only=True, then dist_test.sh evaluates it on 2 ranks. (A run
    # killed and resumed with --resume: test_self_healing.py and
    # tests/test_runner/exact_resume/test_preemption_dist.py.)
    final = load_checkpoint_file(osp.join(work_dir, 'iter_2.pth'))
    assert final['meta']['iter'] == 2
    _evaluate_with_dist_test(synthetic_root,
                             osp.join(work_dir, 'iter_2.pth'), 2, tmp_path)


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


def _launch_port(tmp_path, **env):
    """The --master_port dist_train.sh gives torchrun (a PYTHON stub that
    prints its arguments stands in for it)."""
    stub = tmp_path / 'python_stub'
    stub.write_text('#!/bin/sh\necho "$@"\n')
    stub.chmod(0o755)
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith('SLURM_') and k not in ('PORT', 'NNODES')
    }
    result = subprocess.run(
        ['bash', osp.join(REPO_ROOT, 'tools', 'dist_train.sh'), TINY_CONFIG,
         '2'],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, 'PYTHON': str(stub), **env})
    assert result.returncode == 0, result.stderr
    return int(re.search(r'--master_port=(\d+)', result.stdout)[1])


def test_the_rendezvous_port_is_the_runs_own(tmp_path):
    """Two runs on one machine without PORT get free ports of their own
    (MMDetection's script: 29500 for both, and the second cannot start);
    several nodes in a Slurm job take the job's port, by the formula the
    ``--launcher slurm`` ranks use; PORT wins."""
    from mmddp_ext.launch.environments import slurm_port
    ports = {_launch_port(tmp_path) for _ in range(2)}
    assert len(ports) == 2 and 29500 not in ports
    for port in ports:  # free: it can be bound
        with socket.socket() as s:
            s.bind(('', port))
    for job, step in (('4242', '0'), ('77', '3')):
        assert _launch_port(
            tmp_path, NNODES='2', SLURM_JOB_ID=job,
            SLURM_STEP_ID=step) == slurm_port(job, step)
    assert _launch_port(tmp_path, NNODES='2') == 29500
    assert _launch_port(tmp_path, PORT='31337') == 31337
