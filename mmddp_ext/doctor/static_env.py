"""Static environment checks: versions, the backend a launch would use,
and launcher variables left in the environment."""
import os
import platform
from importlib import metadata
from typing import List

from ..launch.environments import expand_hostlist, slurm_port
from ..launch.process_group import visible_gpu_count
from ..runner.ddp_setup import DDPSetup
from .report import BLOCKER, OK, WARN, Check

PHASE = 'environment'
PACKAGES = ('torch', 'mmengine', 'mmcv', 'mmdet', 'mmddp_ext')
TORCHRUN_VARS = ('RANK', 'WORLD_SIZE', 'LOCAL_RANK', 'LOCAL_WORLD_SIZE',
                 'MASTER_ADDR', 'MASTER_PORT', 'TORCHELASTIC_RUN_ID')
OTHER_LAUNCHER_VARS = ('SLURM_PROCID', 'OMPI_COMM_WORLD_RANK', 'PMI_RANK')


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return 'not installed'


def check_versions() -> Check:
    versions = {name: _version(name) for name in PACKAGES}
    versions['python'] = platform.python_version()
    text = ', '.join(f'{k} {v}' for k, v in versions.items())
    try:
        import mmcv.ops  # noqa: F401
    except ImportError as error:
        return Check(
            PHASE,
            'package versions',
            WARN, f'{text}; mmcv.ops does not import ({error}): '
            'deformable attention and RoI ops are missing',
            details=versions)
    return Check(PHASE, 'package versions', OK, text, details=versions)


def check_backend(cfg, nproc: int, setup: DDPSetup) -> Check:
    gpus = visible_gpu_count()
    requested = ((cfg.get('env_cfg') or {}).get('dist_cfg')
                 or {}).get('backend', 'nccl')
    if gpus >= nproc:
        return Check(PHASE, 'backend', OK,
                     f'{requested} on {nproc} of {gpus} GPU(s)')
    if setup.opted_in:
        return Check(
            PHASE, 'backend', OK,
            f'here: gloo ({gpus} GPU(s) for {nproc} ranks; '
            f'ExtRunner falls back); on {nproc} GPUs: {requested}')
    return Check(
        PHASE,
        'backend',
        WARN, f'{gpus} GPU(s) here for {nproc} ranks: stock Runner calls '
        'torch.cuda.set_device and cannot launch without a GPU per rank',
        on_gpus=f'{requested} with one GPU per rank: fine.',
        fix=["runner_type = 'ExtRunner'  # gloo on CPU, for trying it here"])


def check_launcher_env() -> Check:
    present = {
        k: os.environ[k]
        for k in TORCHRUN_VARS + OTHER_LAUNCHER_VARS if k in os.environ
    }
    if not present:
        return Check(PHASE, 'launcher variables', OK,
                     'no launcher variables in this environment')
    listed = ', '.join(f'{k}={v}' for k, v in present.items())
    if 'LOCAL_RANK' in present and 'WORLD_SIZE' not in present:
        return Check(
            PHASE,
            'launcher variables',
            BLOCKER, f'{listed}: LOCAL_RANK without the rest of torchrun\'s '
            'environment',
            on_gpus='the launch is refused (or every '
            'process claims the same GPU).',
            fix=['unset LOCAL_RANK'])
    return Check(
        PHASE,
        'launcher variables',
        WARN, f'{listed} set in this shell: a launch from here inherits them '
        '(launcher=\'none\' would be refused, a second torchrun nests)',
        fix=['unset ' + ' '.join(present)])


def check_cluster_launch(setup: DDPSetup) -> Check:
    """What a ``--launcher slurm`` launch from here would use, and whether
    a preempted or timed-out job keeps its progress."""
    name = 'cluster launch'
    if not setup.opted_in or setup.ext_cfg.get('preemption') is None:
        return Check(
            PHASE,
            name,
            WARN, 'no PreemptionHook: a preempted, requeued or timed-out job '
            'loses everything since its last checkpoint and, resumed, '
            'trains part of an epoch again',
            on_gpus='on a cluster, each preemption costs up to a '
            'checkpoint interval of training.',
            fix=(["runner_type = 'ExtRunner'"] if not setup.opted_in else []) +
            ['mmddp_ext_cfg = dict(preemption=dict(), '
             'exact_resume=True)'])
    job = os.environ.get('SLURM_JOB_ID')
    if not job:
        return Check(
            PHASE, name, OK, 'preemption checkpoints and exact resume on; '
            'not inside a Slurm job (under srun, --launcher slurm takes '
            "the rendezvous from the job's variables, its port from the "
            'job id)')
    nodes = (
        os.environ.get('SLURM_STEP_NODELIST')
        or os.environ.get('SLURM_JOB_NODELIST', ''))
    try:
        master = os.environ.get('MASTER_ADDR') or expand_hostlist(nodes)[0]
    except (ValueError, IndexError):
        return Check(
            PHASE,
            name,
            BLOCKER,
            f'Slurm job {job}: its node list {nodes!r} cannot be read, so '
            'no rank can find rank 0',
            on_gpus='every rank fails at the rendezvous.',
            fix=['export MASTER_ADDR=<the first node of the job>'])
    if os.environ.get('MASTER_PORT'):
        return Check(
            PHASE,
            name,
            WARN,
            f"Slurm job {job}: MASTER_PORT={os.environ['MASTER_PORT']} is "
            'set, so every job started from this environment uses that '
            'port: two of them on one node collide',
            on_gpus='the second job on a node fails to bind its port.',
            fix=['unset MASTER_PORT  # the port then follows the job id'])
    port = slurm_port(job, os.environ.get('SLURM_STEP_ID', '0'))
    return Check(
        PHASE, name, OK,
        f'Slurm job {job}: rendezvous at {master}:{port} (first node, port '
        'from the job id); preemption checkpoints and exact resume on')


def environment_checks(cfg, nproc: int, setup: DDPSetup) -> List[Check]:
    return [
        check_versions(),
        check_backend(cfg, nproc, setup),
        check_launcher_env(),
        check_cluster_launch(setup),
    ]
