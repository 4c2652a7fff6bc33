"""The ``slurm_cluster`` fixture: a one-node Slurm (tools/slurm_cluster.sh)
for tests that submit real jobs.

    def test_requeue(slurm_cluster, tmp_path):
        job = slurm_cluster.sbatch(script, 'arg', options=['-n', '2'])
        slurm_cluster.wait_state(job, 'RUNNING', timeout=30)

The cluster is started once per machine and left running for later
sessions; pytest-xdist workers take turns through a lock file, and the
script keeps a cluster that already answers. The fixture exports
SLURM_CONF (the Slurm commands find this cluster only through it), so
subprocesses, and the jobs they submit, see it. Where no test Slurm can
run (not root, slurm-wlm or munge missing) the tests are skipped, except
under ``CI=true``, where they fail: CI may not skip them.

Accounting is off (no slurmdbd), so everything here asks
``scontrol show job``, never ``sacct``; a finished job stays visible for
MinJobAge (120 s) after it ends.
"""
import fcntl
import os
import os.path as osp
import re
import subprocess
import time
from typing import Dict, Iterable, Optional, Sequence, Union

import pytest

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CLUSTER_SCRIPT = osp.join(REPO_ROOT, 'tools', 'slurm_cluster.sh')
# tools/slurm_cluster.sh: this machine cannot run a test Slurm.
UNAVAILABLE = 3
START_TIMEOUT = 120
TERMINAL_STATES = frozenset({
    'BOOT_FAIL', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'FAILED', 'NODE_FAIL',
    'OUT_OF_MEMORY', 'TIMEOUT'
})  # not PREEMPTED: a requeueable job goes back to PENDING from there
# 'Key=value' fields of `scontrol show job -o`; a value may hold spaces
# (Command=script args), so it runs to the next ' Key='.
_FIELD = re.compile(r'([A-Za-z][\w:/]*)=(.*?)(?= [A-Za-z][\w:/]*=|$)')


def state_dir() -> str:
    return os.environ.get('MMDDP_EXT_SLURM_DIR', '/tmp/mmddp_ext_slurm')


class SlurmCluster:
    """Submits, watches and cancels jobs on the test cluster.

    Args:
        conf (str): The cluster's slurm.conf (SLURM_CONF).
        partition (str): Its partition (the only one, the default).
    """

    def __init__(self, conf: str, partition: str):
        self.conf = conf
        self.partition = partition

    def env(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        """os.environ with SLURM_CONF and ``extra``."""
        return {**os.environ, 'SLURM_CONF': self.conf, **(extra or {})}

    def run(self,
            *command: str,
            timeout: float = 30,
            env: Optional[Dict[str, str]] = None,
            cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        """Run a Slurm command (text output, both streams captured)."""
        return subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env(env),
            cwd=cwd)

    def sbatch(self,
               script_path: str,
               *args: str,
               env: Optional[Dict[str, str]] = None,
               options: Sequence[str] = (),
               cwd: Optional[str] = None) -> str:
        """Submit ``script_path args`` and return the job id.

        ``options`` go to sbatch before the script (``-n 2``,
        ``--requeue``...). The job's working directory, where its default
        output file slurm-JOBID.out lands, is ``cwd``: the script's own
        directory unless given. The job gets this process's environment
        plus ``env`` (sbatch's default --export=ALL).
        """
        result = self.run(
            'sbatch',
            '--parsable',
            *options,
            script_path,
            *args,
            env=env,
            cwd=cwd or osp.dirname(osp.abspath(script_path)))
        if result.returncode != 0:
            pytest.fail(f'sbatch {script_path} failed: {result.stderr}')
        return result.stdout.strip().split(';')[0]

    def job_info(self, job_id: str) -> Dict[str, str]:
        """``scontrol show job -o`` as a dict (JobState, Restarts, ExitCode,
        NodeList, ...); empty once Slurm has forgotten the job. A Command
        value is cut at an argument that holds 'name='."""
        result = self.run('scontrol', 'show', 'job', '-o', job_id)
        if result.returncode != 0:
            if 'Invalid job id' in result.stderr:
                return {}
            pytest.fail(f'scontrol show job {job_id}: {result.stderr}')
        line = result.stdout.splitlines()[0] if result.stdout else ''
        return dict(_FIELD.findall(line))

    def wait_state(self,
                   job_id: str,
                   states: Union[str, Iterable[str]],
                   timeout: float,
                   restarts: int = 0) -> Dict[str, str]:
        """Poll until the job's JobState is one of ``states`` and it has
        been requeued at least ``restarts`` times; returns its job_info.

        Fails at ``timeout`` seconds, or at once when the job ends in a
        state not asked for (its output file is then the place to look).
        """
        wanted = {states} if isinstance(states, str) else set(states)
        deadline = time.monotonic() + timeout
        info: Dict[str, str] = {}
        while time.monotonic() < deadline:
            info = self.job_info(job_id)
            state = info.get('JobState', '')
            done = int(info.get('Restarts', 0)) >= restarts
            if state in wanted and done:
                return info
            if state in TERMINAL_STATES and done:
                break
            time.sleep(0.5)
        pytest.fail(f'job {job_id}: not {sorted(wanted)} with Restarts >= '
                    f'{restarts} within {timeout} s; last seen: '
                    f'{info or "forgotten by Slurm"}')

    def release(self, job_id: str) -> None:
        """Start a requeued job now instead of after Slurm's requeue delay
        (a pending job's begin time moved to now)."""
        result = self.run('scontrol', 'update', f'JobId={job_id}',
                          'StartTime=now')
        if result.returncode != 0:
            pytest.fail(f'scontrol update {job_id}: {result.stderr}')

    def cancel(self, job_id: str, signal: Optional[str] = None) -> None:
        """scancel the job, or send it ``signal`` (e.g. 'USR1'): without
        --batch/--full Slurm signals the tasks of its steps, not the batch
        shell."""
        options = [f'--signal={signal}'] if signal else []
        result = self.run('scancel', *options, job_id)
        if result.returncode != 0:
            pytest.fail(f'scancel {job_id}: {result.stderr}')


def start_cluster(script: str = CLUSTER_SCRIPT) -> str:
    """Start (or find) the test cluster and return its SLURM_CONF; skip,
    or fail under CI=true, where this machine cannot run one."""
    directory = state_dir()
    os.makedirs(directory, exist_ok=True)
    # One starter at a time: the others wait, then find it answering.
    with open(osp.join(directory, 'start.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(['bash', script, 'start'],
                                capture_output=True,
                                text=True,
                                timeout=START_TIMEOUT)
    if result.returncode == UNAVAILABLE:
        reason = (result.stderr.strip().splitlines() or ['no reason'])[-1]
        if os.environ.get('CI') == 'true':
            pytest.fail(f'{reason} (CI=true: the Slurm tests may not skip)')
        pytest.skip(reason)
    found = re.search(r'^export SLURM_CONF=(.+)$', result.stdout, re.M)
    if result.returncode != 0 or not found:
        pytest.fail(f'{script} start failed (exit {result.returncode}):\n'
                    f'{result.stdout}{result.stderr}')
    return found[1]


@pytest.fixture(scope='session')
def slurm_cluster() -> SlurmCluster:
    conf = start_cluster()
    os.environ['SLURM_CONF'] = conf
    partitions = subprocess.run(['sinfo', '-h', '-o', '%P'],
                                capture_output=True,
                                text=True,
                                timeout=30,
                                check=True).stdout.split()
    default = [p for p in partitions if p.endswith('*')] or partitions
    return SlurmCluster(conf, default[0].rstrip('*'))
