"""Training on a real one-node Slurm (tests/slurm_cluster.py starts it):
tools/slurm_train.sh on 2 tasks, two jobs at once without MASTER_PORT,
a user's own sbatch script preempted with SIGUSR1 mid-epoch, requeued and
resumed exactly (control: MMEngine's resume, in a job beside it, ends
elsewhere), and a task SIGKILLed under a plain srun.

The run is the toy of tests/test_runner/exact_resume (3 epochs of 3
iterations per rank, dropout and noise, augmentation from the global
generators, momentum, a per-iteration schedule, EMA).
"""
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time

import pytest

from ..helpers import REPO_ROOT
from ..test_runner.exact_resume.runs import (CONFIG, ITERS, RUN_TIMEOUT_S,
                                             finish, same_run, start_launcher,
                                             toy_options, train_uninterrupted,
                                             trained_lines, wait_for_lines)
from ..test_runner.exact_resume.toy import read_trained

BATCH_SCRIPT = osp.join(REPO_ROOT, 'tools', 'slurm_batch_example.sh')
CPU_TASKS = dict(GPUS='2', CPUS_PER_TASK='1', SRUN_ARGS='--overcommit')


def _slurm_train(cluster, work_dir, options):
    return start_launcher([
        'bash',
        osp.join(REPO_ROOT, 'tools', 'slurm_train.sh'), cluster.partition,
        'toy', CONFIG,
        str(work_dir), '--cfg-options', *options
    ], cluster.env(dict(CPU_TASKS, PYTHON=sys.executable)))


def test_two_jobs_on_one_node_train_at_once(slurm_cluster, tmp_path):
    """tools/slurm_train.sh, 2 tasks each, two jobs at once, no
    MASTER_PORT anywhere: each job's rendezvous has its own port."""
    assert 'MASTER_PORT' not in os.environ
    dirs = [tmp_path / 'a', tmp_path / 'b']
    procs = [_slurm_train(slurm_cluster, d, toy_options(d)) for d in dirs]
    outs = [finish(p) for p in procs]
    ports = set()
    for (code, out), work_dir in zip(outs, dirs):
        assert code == 0, out[-6000:]
        found = re.findall(
            r'gloo process group, rank 0/2 on cpu .* through \S+:(\d+) '
            r'\(Slurm job (\d+), task 0\)', out)
        assert found, out[-6000:]
        ports.add(found[0][0])
        assert osp.exists(osp.join(work_dir, f'epoch_{ITERS // 3}.pth'))
        assert trained_lines(work_dir, 1) == ITERS  # rank 1 trained its share
    assert len(ports) == 2, outs


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory):
    return train_uninterrupted(str(tmp_path_factory.mktemp('uninterrupted')))


def _submit(cluster, work_dir, exact):
    out = osp.join(work_dir + '_job.out')
    job = cluster.sbatch(
        BATCH_SCRIPT,
        CONFIG,
        work_dir,
        '--cfg-options',
        *toy_options(work_dir, delay=0.4, exact=exact),
        options=[
            '--ntasks=2', '--ntasks-per-node=2', '--cpus-per-task=1',
            '--overcommit', f'--output={out}', '--time=10'
        ],
        env=dict(PYTHON=sys.executable),
        cwd=REPO_ROOT)
    return job, out


def _signal_each_mid_run(cluster, work_dirs, count=4):
    """SIGUSR1 to each job as soon as its rank 0 has trained ``count``
    iterations (the second epoch has begun). The jobs run side by side:
    waited on one after the other, the second had once trained to its end
    while the first was still starting, and the signal then killed its
    exiting tasks (their handler already put back)."""
    pending = dict(work_dirs)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while pending:
        for job, work_dir in list(pending.items()):
            if trained_lines(work_dir) >= count:
                cluster.cancel(job, signal='USR1')
                del pending[job]
        assert time.monotonic() < deadline, f'no progress in {pending}'
        time.sleep(0.05)


# 52 s quiet before its requeued jobs were released at once, 128 s in the
# suite
@pytest.mark.timeout(400)
def test_preempted_batch_job_requeues_and_resumes_exactly(
        slurm_cluster, tmp_path, uninterrupted):
    """The user's own sbatch script (tools/slurm_batch_example.sh), 2
    tasks; ``scancel --signal=USR1`` mid-epoch: the ranks checkpoint at one
    iteration, the job requeues itself, starts again and resumes by itself
    to the uninterrupted run's end. The control job beside it, the same
    with MMEngine's resume (exact_resume=False), ends elsewhere."""
    jobs = {}
    for exact in (True, False):
        work_dir = str(tmp_path / f'exact_{exact}')
        jobs[exact] = (*_submit(slurm_cluster, work_dir, exact), work_dir)
    _signal_each_mid_run(slurm_cluster,
                         {job: work_dir for job, _, work_dir in jobs.values()})
    for job, _, _ in jobs.values():
        # requeued by the job itself; started at once, not after Slurm's
        # requeue delay
        slurm_cluster.wait_state(
            job, 'PENDING', timeout=RUN_TIMEOUT_S, restarts=1)
        slurm_cluster.release(job)
    for job, _, _ in jobs.values():
        slurm_cluster.wait_state(
            job, 'COMPLETED', timeout=RUN_TIMEOUT_S, restarts=1)
    for exact, (job, out, work_dir) in jobs.items():
        with open(out) as f:
            log = f.read()
        stops = re.findall(
            r'PreemptionHook: SIGUSR1: rank (\d) stops after iteration (\d+)'
            r'.* requeueing job (\d+)', log)
        assert sorted(s[0] for s in stops) == ['0', '1'], log[-6000:]
        assert len({s[1] for s in stops}) == 1, stops  # the same iteration
        trained = int(stops[0][1])
        assert 4 <= trained < ITERS and stops[0][2] == job
        assert 'run 2,' in log  # the batch script started again
        assert f'Slurm requeue 1 of job {job}' in log
        assert f'resuming from {work_dir}/iter_{trained}.pth' in log
        assert same_run(work_dir, uninterrupted) == exact, log[-3000:]


@pytest.mark.parametrize('watchdog', ['1', '0'])
def test_a_killed_task_stops_the_others(slurm_cluster, tmp_path, watchdog):
    """A plain srun without --kill-on-bad-exit: rank 1 is SIGKILLed; rank 0
    names it and stops within 30 s. The control, without the peer watchdog
    (MMDDP_EXT_PEER_WATCHDOG=0): on CPU ranks gloo fails rank 0's next
    collective too, but nothing names the rank that died (NCCL would wait
    for the collective timeout)."""
    work_dir = str(tmp_path / 'run')
    proc = subprocess.Popen([
        'srun', '-p', slurm_cluster.partition, '--ntasks=2', '--overcommit',
        sys.executable, '-u', 'tools/train.py', CONFIG, '--launcher', 'slurm',
        '--work-dir', work_dir, '--cfg-options',
        *toy_options(work_dir, delay=0.5)
    ],
                            cwd=REPO_ROOT,
                            env=slurm_cluster.env(
                                dict(
                                    PYTHONPATH=REPO_ROOT,
                                    OMP_NUM_THREADS='1',
                                    MMDDP_EXT_PEER_WATCHDOG=watchdog)),
                            stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT,
                            text=True,
                            start_new_session=True)
    wait_for_lines(work_dir, 2, rank=1)
    victim = read_trained(work_dir, 1, with_pid=True)[0]['pid']
    os.kill(victim, signal.SIGKILL)
    killed = time.monotonic()
    code, out = finish(proc, timeout=60)
    assert time.monotonic() - killed < 30, out[-4000:]
    assert code != 0
    named = re.search(rf'rank 1 \(host \S+, pid {victim}\) stopped', out)
    assert bool(named) == (watchdog == '1'), out[-6000:]
    assert ('Rank 0 on' in out and 'stops now' in out) == bool(named)


def test_spawning_ranks_inside_an_srun_task_is_refused(slurm_cluster):
    """The launcher check that refuses mp.spawn inside torchrun covers a
    task of a Slurm step too."""
    result = slurm_cluster.run(
        'srun',
        '-p',
        slurm_cluster.partition,
        '--ntasks=1',
        sys.executable,
        osp.join(REPO_ROOT, 'tests', 'test_runner',
                 'spawn_inside_torchrun.py'),
        timeout=120,
        cwd=REPO_ROOT)
    assert 'CHILD REFUSED: Two layers of process management' in \
        result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    assert 'a rank that srun already launched' in result.stdout
