"""RunsInOneLaunch on 2 real gloo ranks: one launch for every run when
all goes well; a run that fails fails only the requests for it, the runs
before it count, the runs after it start in a fresh launch when asked
for."""
import os

import pytest
import torch
import torch.distributed as dist

from mmddp_ext.testing import MultiRankError, RunsInOneLaunch


def _toy_run(offset, name, outcome):
    """Every rank raises for ``outcome == 'raise'`` (at once: a rank left
    waiting in a collective would hold the launch for the launcher's
    grace); otherwise all-reduces and reports the sum and its process
    id."""
    if outcome == 'raise':
        raise ValueError(f'{name} failed on rank {dist.get_rank()}')
    value = torch.ones(1) * (dist.get_rank() + offset)
    dist.all_reduce(value)
    return value.item(), os.getpid()


def _runs(tmp_path, outcomes):
    return RunsInOneLaunch(
        _toy_run, [(name, outcome) for name, outcome in outcomes],
        2,
        results_dir=str(tmp_path),
        run_limit_s=60,  # each toy run takes well under a second
        launch_limit_s=60,
        args=(10, ),
        what='toy run')


def _launches(tmp_path):
    return sorted(p for p in os.listdir(tmp_path) if p.startswith('launch'))


def test_every_run_in_one_launch(tmp_path):
    runs = _runs(tmp_path, [('a', 'ok'), ('b', 'ok'), ('c', 'ok')])
    assert runs.names == ('a', 'b', 'c')
    first = runs.of('a')
    assert [value for value, _ in first] == [21.0, 21.0]  # 10 + 11
    pids = {pid for name in runs.names for _, pid in runs.of(name)}
    assert pids == {pid for _, pid in first}
    assert _launches(tmp_path) == ['launch0']
    assert all(0 < s < 60 for s in runs.seconds('c'))


def test_a_failed_run_fails_alone(tmp_path):
    runs = _runs(tmp_path, [('a', 'ok'), ('b', 'raise'), ('c', 'ok'),
                            ('d', 'ok')])
    first = runs.of('a')  # launches a, b, c and d; b fails
    assert [value for value, _ in first] == [21.0, 21.0]
    with pytest.raises(MultiRankError) as failure:
        runs.of('b')
    message = str(failure.value)
    assert "toy run 'b' did not finish on every rank (limits: 60 s for " \
        'the run' in message
    assert 'ValueError: b failed on rank 1' in message
    assert '===== rank 0' in message and '===== rank 1' in message
    assert _launches(tmp_path) == ['launch0']  # nothing more until asked
    third = runs.of('c')  # a fresh launch: c and d
    assert [value for value, _ in third] == [21.0, 21.0]
    assert not {pid for _, pid in first} & {pid for _, pid in third}
    assert runs.of('d') == third  # the same processes, the same sum
    assert _launches(tmp_path) == ['launch0', 'launch1']
    with pytest.raises(MultiRankError):
        runs.of('b')  # stays failed, without another launch
    assert len(_launches(tmp_path)) == 2


def test_names_are_checked():
    with pytest.raises(ValueError, match='distinct str names'):
        RunsInOneLaunch(_toy_run, [('a', 'ok'), ('a', 'ok')], 2, '/none',
                        60, 60)
    runs = RunsInOneLaunch(_toy_run, [('a', 'ok')], 2, '/none', 60, 60)
    with pytest.raises(KeyError, match="no run called 'z'"):
        runs.of('z')
