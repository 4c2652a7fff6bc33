"""The Slurm rendezvous from Slurm's own variables (scontrol only for a
first node whose name does not resolve), and which launcher started a
process. The real Slurm runs are in
tests/test_tools/test_slurm_train.py."""
import os
import socket

import pytest

from mmddp_ext.launch.environments import (expand_hostlist,
                                           expand_tasks_per_node,
                                           export_slurm_rendezvous,
                                           launched_by, node_address,
                                           slurm_port, slurm_rendezvous,
                                           without_outer_launcher)

TASK = dict(
    SLURM_JOB_ID='4242',
    SLURM_STEP_ID='0',
    SLURM_PROCID='3',
    SLURM_NTASKS='4',
    SLURM_LOCALID='1',
    SLURM_STEP_NODELIST='gpu[07-08]',
    SLURM_JOB_NODELIST='gpu[07-08],login1',
    SLURM_STEP_TASKS_PER_NODE='2(x2)',
    SLURMD_NODENAME='gpu08')


@pytest.mark.parametrize('text, hosts', [
    ('node1', ['node1']),
    ('gpu[01-03,07]', ['gpu01', 'gpu02', 'gpu03', 'gpu07']),
    ('a[9-10]', ['a9', 'a10']),
    ('r[1-2]-n[08-09],solo', ['r1-n08', 'r1-n09', 'r2-n08', 'r2-n09', 'solo']),
    ('login-[2-3]x', ['login-2x', 'login-3x']),
])
def test_host_lists_expand_as_scontrol_prints_them(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize('text',
                         ['gpu[01-03', 'gpu01]', 'gpu[3-1]', 'gpu[a-b]'])
def test_malformed_host_lists_are_refused(text):
    with pytest.raises(ValueError, match='host'):
        expand_hostlist(text)


def test_tasks_per_node_expand():
    assert expand_tasks_per_node('2(x3),1') == [2, 2, 2, 1]
    assert expand_tasks_per_node('8') == [8]
    with pytest.raises(ValueError, match="'N' or 'N\\(xK\\)'"):
        expand_tasks_per_node('2x3')


def test_rendezvous_from_slurm_variables():
    assert slurm_rendezvous(TASK) == dict(
        RANK='3',
        WORLD_SIZE='4',
        LOCAL_RANK='1',
        LOCAL_WORLD_SIZE='2',
        MASTER_ADDR='gpu07',  # the step's first node, not the job's
        MASTER_PORT=str(slurm_port('4242', '0')))


def test_the_users_port_and_address_win():
    env = dict(TASK, MASTER_ADDR='10.0.0.1', MASTER_PORT='23456')
    values = slurm_rendezvous(env)
    assert (values['MASTER_ADDR'], values['MASTER_PORT']) == ('10.0.0.1',
                                                              '23456')
    # env_cfg.dist_cfg.port wins over MASTER_PORT, as in MMEngine
    assert slurm_rendezvous(env, port=31000)['MASTER_PORT'] == '31000'


def test_jobs_and_steps_get_their_own_port():
    ports = {slurm_port(str(job), '0') for job in range(1000, 2000)}
    assert len(ports) == 1000  # a thousand consecutive jobs never collide
    assert slurm_port('1000', '0') != slurm_port('1000', '1')
    assert all(12000 <= p < 29000 for p in ports)  # not ephemeral, not 29500


def test_a_process_outside_srun_is_refused_with_the_fix():
    env = {k: v for k, v in TASK.items() if k != 'SLURM_PROCID'}
    with pytest.raises(ValueError, match='SLURM_PROCID is not set.*srun'):
        slurm_rendezvous(env)


def test_launched_by():
    assert launched_by({}) == 'plain'
    assert launched_by(TASK) == 'slurm'
    assert launched_by(dict(TASK, TORCHELASTIC_RUN_ID='x')) == 'torchrun'
    # a batch script's shell is not a task of a step
    assert launched_by(dict(SLURM_JOB_ID='1', SLURM_PROCID='0')) == 'plain'
    assert launched_by(dict(WORLD_SIZE='2')) == 'torchrun'
    # ranks our own launcher starts inside a step are its ranks
    assert launched_by(without_outer_launcher(TASK)) == 'plain'


def test_launcher_none_in_a_many_task_step_is_refused(monkeypatch):
    from mmddp_ext.launch.process_group import check_launch_environment
    for key, value in TASK.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match='task 3 of 4 .*--launcher slurm'):
        check_launch_environment('none')


def test_launcher_slurm_outside_a_step_is_refused(monkeypatch):
    from mmddp_ext.launch.process_group import check_launch_environment
    for key in ('SLURM_STEP_ID', 'SLURM_PROCID', 'TORCHELASTIC_RUN_ID'):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="launcher='slurm' needs a task"):
        check_launch_environment('slurm')


# A name that never resolves (RFC 2606), as a node named only in
# slurm.conf, with NodeAddr giving its address.
UNRESOLVED = 'mmddp-node-7.invalid'


def _scontrol(tmp_path, monkeypatch, script):
    """A stub ``scontrol`` first on PATH."""
    stub = tmp_path / 'scontrol'
    stub.write_text('#!/bin/sh\n' + script)
    stub.chmod(0o755)
    monkeypatch.setenv('PATH', f"{tmp_path}:{os.environ['PATH']}")


def test_a_first_node_without_dns_is_reached_at_its_node_addr(
        tmp_path, monkeypatch):
    """slurm.conf's NodeAddr, where the node's name does not resolve; the
    control: that name is what the ranks would otherwise connect to, and
    it does not resolve."""
    _scontrol(
        tmp_path, monkeypatch, 'echo "NodeName=$4 Arch=x86_64 CPUs=8 '
        'NodeAddr=10.1.2.3 NodeHostName=$4 Version=22.05"\n')
    for key, value in TASK.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv('SLURM_STEP_NODELIST', 'mmddp-node-[7-8].invalid')
    monkeypatch.delenv('MASTER_ADDR', raising=False)
    monkeypatch.delenv('MASTER_PORT', raising=False)
    assert slurm_rendezvous()['MASTER_ADDR'] == UNRESOLVED
    with pytest.raises(socket.gaierror):
        socket.getaddrinfo(UNRESOLVED, None)
    assert export_slurm_rendezvous()['MASTER_ADDR'] == '10.1.2.3'


def test_a_name_that_resolves_is_kept(tmp_path, monkeypatch):
    _scontrol(tmp_path, monkeypatch, 'exit 1\n')  # not asked
    assert node_address('localhost') == 'localhost'


def test_no_address_for_the_first_node_is_refused_with_the_fix(
        tmp_path, monkeypatch):
    _scontrol(tmp_path, monkeypatch,
              'echo "slurm_load_node error: Invalid node name" >&2\nexit 1\n')
    with pytest.raises(ValueError,
                       match=f"'{UNRESOLVED}'.*does not resolve.*"
                       'printed no NodeAddr.*Invalid node name.*'
                       'Set MASTER_ADDR'):
        node_address(UNRESOLVED)
