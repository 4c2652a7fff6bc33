"""tools/slurm_train.sh and slurm_test.sh: argument checks, the --gres
decision, and two real srun tasks on the one-node test Slurm; the
slurm_cluster fixture's own helpers and its skip/fail rule."""
import os
import os.path as osp
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from ..slurm_cluster import REPO_ROOT, start_cluster

TOOLS = osp.join(REPO_ROOT, 'tools')
SCRIPTS = {'slurm_train.sh': 'WORK_DIR', 'slurm_test.sh': 'CHECKPOINT'}
TIMEOUT = 60


def run_script(name, args, env=None, path_first=None):
    """bash tools/NAME ARGS with ``env`` added and ``path_first`` (a
    directory of stub commands) at the front of PATH."""
    full_env = {**os.environ, **(env or {})}
    if path_first:
        full_env['PATH'] = f'{path_first}:{full_env["PATH"]}'
    return subprocess.run(['bash', osp.join(TOOLS, name), *args],
                          capture_output=True,
                          text=True,
                          timeout=TIMEOUT,
                          env=full_env,
                          cwd=REPO_ROOT)


def write_executable(path, text):
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def config(tmp_path):
    (tmp_path / 'cfg.py').write_text('')
    return str(tmp_path / 'cfg.py')


@pytest.mark.parametrize('name', sorted(SCRIPTS))
def test_missing_arguments_print_usage(name, config):
    result = run_script(name, ['debug', 'job', config])
    assert result.returncode == 2, result.stderr
    assert (f'usage: bash tools/{name} PARTITION JOB_NAME CONFIG '
            f'{SCRIPTS[name]}') in result.stderr


@pytest.mark.parametrize('name', sorted(SCRIPTS))
def test_missing_config_is_named(name, tmp_path):
    missing = str(tmp_path / 'nope.py')
    result = run_script(name, ['debug', 'job', missing, 'x'])
    assert result.returncode == 2
    assert f"config file '{missing}' does not exist" in result.stderr


@pytest.mark.parametrize('name', sorted(SCRIPTS))
@pytest.mark.parametrize('variable,value', [('GPUS', 'two'),
                                            ('GPUS_PER_NODE', '0'),
                                            ('CPUS_PER_TASK', '1.5')])
def test_bad_counts_are_named(name, variable, value, config):
    result = run_script(
        name, ['debug', 'job', config, 'x'], env={variable: value})
    assert result.returncode == 2
    assert (f"{variable} must be a positive integer, got '{value}'"
            in result.stderr)


@pytest.fixture
def stub_slurm(tmp_path):
    """A directory with an ``sinfo`` that prints $STUB_GRES for any
    partition and an ``srun`` that writes its argv, one per line, to
    $STUB_SRUN_LOG."""
    stubs = tmp_path / 'stubs'
    stubs.mkdir()
    write_executable(stubs / 'sinfo', '#!/bin/sh\necho "$STUB_GRES"\n')
    write_executable(stubs / 'srun',
                     '#!/bin/sh\nprintf "%s\\n" "$@" > "$STUB_SRUN_LOG"\n')
    return str(stubs)


@pytest.mark.parametrize('gres,gpus', [('gpu:8', True),
                                       ('gpu:a100:4(S:0-1),mps:400', True),
                                       ('(null)', False), ('mps:400', False)])
def test_gres_only_where_the_partition_has_gpus(gres, gpus, config, stub_slurm,
                                                tmp_path):
    log = tmp_path / 'srun.log'
    result = run_script(
        'slurm_train.sh', ['gpu_part', 'job', config, 'work'],
        env=dict(
            STUB_GRES=gres,
            STUB_SRUN_LOG=str(log),
            GPUS='4',
            GPUS_PER_NODE='2'),
        path_first=stub_slurm)
    assert result.returncode == 0, result.stderr
    argv = log.read_text().splitlines()
    assert ('--gres=gpu:2' in argv) == gpus
    assert argv[:8] == [
        '-p', 'gpu_part', '--job-name=job', '--ntasks=4',
        '--ntasks-per-node=2', '--cpus-per-task=5', '--kill-on-bad-exit=1',
        *(['--gres=gpu:2'] if gpus else ['python3'])
    ]


def test_gpus_per_node_defaults_to_at_most_eight(config, stub_slurm, tmp_path):
    log = tmp_path / 'srun.log'
    for gpus, per_node in (('2', '2'), ('16', '8')):
        result = run_script(
            'slurm_train.sh', ['p', 'job', config, 'work'],
            env=dict(STUB_GRES='gpu:8', STUB_SRUN_LOG=str(log), GPUS=gpus),
            path_first=stub_slurm)
        assert result.returncode == 0, result.stderr
        argv = log.read_text().splitlines()
        assert f'--ntasks-per-node={per_node}' in argv
        assert f'--gres=gpu:{per_node}' in argv


def test_fixture_skips_or_fails_under_ci(tmp_path, monkeypatch):
    unavailable = write_executable(
        tmp_path / 'cluster.sh',
        'echo "slurm_cluster.sh: not root: reason" >&2\nexit 3\n')
    monkeypatch.setenv('MMDDP_EXT_SLURM_DIR', str(tmp_path / 'state'))
    monkeypatch.delenv('CI', raising=False)
    with pytest.raises(pytest.skip.Exception, match='not root: reason'):
        start_cluster(unavailable)
    monkeypatch.setenv('CI', 'true')
    with pytest.raises(pytest.fail.Exception, match='CI=true'):
        start_cluster(unavailable)


def test_cluster_script_needs_root(tmp_path):
    """start exits 3 with its reason for a user that is not root (and
    finds no cluster in an empty state dir)."""
    script = osp.join(TOOLS, 'slurm_cluster.sh')
    state = tmp_path / 'state'
    state.mkdir()
    state.chmod(0o777)
    readable = tempfile.mkdtemp()
    if os.geteuid() == 0:
        # a copy the user can read: the checkout may sit in a folder only
        # root enters (a clone in mktemp -d, CI's)
        os.chmod(readable, 0o755)
        shutil.copy(script, readable)
        script = osp.join(readable, 'slurm_cluster.sh')
        os.chmod(script, 0o755)
    command = ['bash', script, 'start']
    if os.geteuid() == 0:
        command = ['runuser', '-u', 'nobody', '--', *command]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={
            **os.environ, 'MMDDP_EXT_SLURM_DIR': str(state)
        },
        cwd='/')
    shutil.rmtree(readable)
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        'slurm_cluster.sh: ')
    assert ('not root' in result.stderr
            or 'apt-get install slurm-wlm munge' in result.stderr)


def test_cluster_status(slurm_cluster):
    result = subprocess.run(
        ['bash', osp.join(TOOLS, 'slurm_cluster.sh'), 'status'],
        capture_output=True,
        text=True,
        timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr
    assert os.environ['SLURM_CONF'] == slurm_cluster.conf


@pytest.mark.parametrize('name,lead', [('slurm_train.sh', '--work-dir=W'),
                                       ('slurm_test.sh', 'CKPT')])
def test_two_tasks_on_a_partition_without_gpus(name, lead, slurm_cluster,
                                               config, tmp_path):
    """The real srun runs 2 tasks of a PYTHON stub that prints its argv and
    Slurm environment; no --gres is asked for (the srun wrapper's argv,
    and the job's TRES in scontrol)."""
    stubs = tmp_path / 'stubs'
    stubs.mkdir()
    log = tmp_path / 'srun.log'
    write_executable(
        stubs / 'srun', f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n'
        f'exec {shutil.which("srun")} "$@"\n')
    python = write_executable(
        tmp_path / 'python', '#!/bin/sh\necho "TASK $SLURM_PROCID '
        '$SLURM_NTASKS $SLURM_LOCALID $SLURM_JOB_ID $OMP_NUM_THREADS '
        '$PYTHONPATH ARGV $*"\n')
    last = 'W' if lead.startswith('--work-dir') else lead
    result = run_script(
        name, [slurm_cluster.partition, 'mmddp_job', config, last, '--x', 'y'],
        env=dict(
            GPUS='2',
            CPUS_PER_TASK='1',
            SRUN_ARGS='--overcommit',
            PYTHON=python,
            PYTHONPATH=''),
        path_first=str(stubs))
    assert result.returncode == 0, result.stderr
    tasks = re.findall(r'^TASK (\S+) (\S+) (\S+) (\S+) (\S+) (\S+) ARGV (.*)$',
                       result.stdout, re.M)
    assert sorted(t[0] for t in tasks) == ['0', '1'], result.stdout
    script = 'train.py' if name == 'slurm_train.sh' else 'test.py'
    for _, ntasks, localid, job_id, threads, pythonpath, argv in tasks:
        assert (ntasks, threads, pythonpath) == ('2', '1', REPO_ROOT)
        assert argv == (f'-u {TOOLS}/{script} {config} {lead} '
                        '--launcher=slurm --x y')
    assert sorted(t[2] for t in tasks) == ['0', '1']
    argv = log.read_text().splitlines()
    assert '--job-name=mmddp_job' in argv and '--overcommit' in argv
    assert not any(a.startswith('--gres') for a in argv)
    info = slurm_cluster.job_info(tasks[0][3])
    assert info['JobName'] == 'mmddp_job'
    assert 'gpu' not in info.get('TresPerNode', '') + info['TRES']


def test_cluster_helpers_submit_signal_and_cancel(slurm_cluster, tmp_path):
    """sbatch/wait_state/job_info/cancel on a 2-task job; USR1 sent with
    cancel(signal=) reaches the step's tasks, not the batch shell (what a
    checkpoint-on-signal runner relies on)."""
    out = tmp_path / 'job.out'
    script = write_executable(
        tmp_path / 'job.sh', """#!/bin/bash
trap 'echo batch got USR1' USR1
srun bash -c 'trap "echo task $SLURM_PROCID got USR1; exit 0" USR1
    echo ready; while :; do sleep 0.1; done'
echo "batch done $1"
""")
    job = slurm_cluster.sbatch(
        script, 'arg1', options=['-n', '2', '--overcommit', f'-o{out}'])
    info = slurm_cluster.wait_state(job, 'RUNNING', timeout=30)
    assert info['NumTasks'] == '2' and info['Restarts'] == '0'
    for _ in range(60):
        if out.exists() and out.read_text().count('ready') == 2:
            break
        time.sleep(0.25)
    slurm_cluster.cancel(job, signal='USR1')
    slurm_cluster.wait_state(job, 'COMPLETED', timeout=30)
    text = out.read_text()
    assert 'task 0 got USR1' in text and 'task 1 got USR1' in text, text
    assert 'batch got USR1' not in text and 'batch done arg1' in text, text

    sleeper = slurm_cluster.sbatch(
        script, options=['-n', '1', f'-o{tmp_path}/sleeper.out'])
    slurm_cluster.wait_state(sleeper, 'RUNNING', timeout=30)
    slurm_cluster.cancel(sleeper)
    info = slurm_cluster.wait_state(sleeper, 'CANCELLED', timeout=30)
    assert info['JobState'] == 'CANCELLED'
    assert slurm_cluster.job_info('999999999') == {}
