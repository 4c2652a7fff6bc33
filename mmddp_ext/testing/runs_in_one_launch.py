"""Several named runs (trainings, probes) on the same ranks, one launch for
all of them when all goes well, each failing alone.

A launch of fresh ranks pays their start and warm-up (the first Runner,
the first iteration): training the AMP families in one launch per family
took 61 % longer than in one launch for all. In one launch, though, a run
that fails or hangs used to take every run after it, and every test
reading them, down with it. :class:`RunsInOneLaunch` keeps the one launch
and gives each run its own limit, its own saved result and its own
failure; the runs after a failed one start in a fresh launch when asked
for.
"""
import faulthandler
import os
import os.path as osp
import pickle
import time
from typing import Any, Callable, Dict, List, Optional, Sequence
from urllib.parse import quote

from ..launch.rank_launcher import MultiRankError, run_on_ranks, save_on_host


def run_in_turn(fn: Callable, args: Sequence, runs: Sequence[tuple],
                results_dir: str, run_limit_s: float) -> None:
    """On every rank: ``fn(*args, *run)`` for each run in turn, its result
    (and wall time) saved as soon as it returns, so that the runs before
    one that fails or hangs still count (:meth:`RunsInOneLaunch.of` reads
    them back).

    A run may take ``run_limit_s``; past it the rank exits with
    "Timeout" and every thread's stack in its log (``faulthandler``, whose
    watchdog thread also fires while the main thread waits in a
    collective), and its peers are stopped by the launcher.

    Args:
        fn (callable): Module-level function run on every rank; returns
            the run's picklable result there.
        args (Sequence): The arguments every run passes first.
        runs (Sequence[tuple]): ``(name, *params)`` in the order they run.
        results_dir (str): Where the results go.
        run_limit_s (float): Each run's limit in seconds.
    """
    rank = int(os.environ['RANK'])
    for run in runs:
        start = time.perf_counter()
        faulthandler.dump_traceback_later(run_limit_s, exit=True)
        try:
            result = fn(*args, *run)
        finally:
            faulthandler.cancel_dump_traceback_later()
        save_on_host(
            dict(result=result, seconds=time.perf_counter() - start),
            _result_path(results_dir, run[0], rank))


def _result_path(results_dir: str, name: str, rank: int) -> str:
    return osp.join(results_dir, f'{quote(name, safe="")}.rank{rank}.pkl')


def _saved(results_dir: str, name: str, rank: int) -> Optional[dict]:
    path = _result_path(results_dir, name, rank)
    if not osp.exists(path):
        return None
    with open(path, 'rb') as f:
        return pickle.load(f)


class RunsInOneLaunch:
    """Named runs on ``world_size`` ranks, launched as tests ask for them.

    The first request for a run that has not run yet launches it and every
    waiting run after it, in their order (:func:`run_in_turn`): in the
    good case the first request trains them all in one launch. A run
    that fails or passes its limit fails only the requests for it (with
    the limits and every rank's log): the runs before it were saved as
    each finished, the runs after it wait for a fresh launch, started
    when one of them is asked for. Runs that break the process group on
    purpose (negative controls) therefore go last.

    A test that needs several runs asks for them in their order; it then
    starts at most one launch unless one of them failed.

    Args:
        fn (callable): Module-level function called on every rank as
            ``fn(*args, *run)`` for each run; returns that run's picklable
            result on that rank (tensors come back on the host).
        runs (Sequence[tuple]): ``(name, *params)``, in the order they
            run; each name a distinct str.
        world_size (int): Number of ranks.
        results_dir (str): Where each run's result is saved per rank, and
            each launch's rank logs (``launch<i>/``).
        run_limit_s (float): Each run's limit in seconds, checked in the
            ranks.
        launch_limit_s (float): Each launch's limit in seconds (the
            ``timeout`` of :func:`run_on_ranks`).
        args (Sequence): The arguments every run passes ``fn`` first.
            Defaults to ().
        what (str): What the failure messages call a run. Defaults to
            ``'run'``.

    Attributes:
        names (tuple[str]): The runs' names, in their order.
    """

    def __init__(self,
                 fn: Callable,
                 runs: Sequence[tuple],
                 world_size: int,
                 results_dir: str,
                 run_limit_s: float,
                 launch_limit_s: float,
                 args: Sequence = (),
                 what: str = 'run'):
        names = [run[0] for run in runs]
        distinct = len(set(names)) == len(names)
        if not distinct or not all(isinstance(n, str) for n in names):
            raise ValueError('runs must be (name, *params) tuples with '
                             f'distinct str names, but got names {names}.')
        self.fn = fn
        self.world_size = world_size
        self.results_dir = results_dir
        self.run_limit_s = run_limit_s
        self.launch_limit_s = launch_limit_s
        self.args = tuple(args)
        self.what = what
        self.names = tuple(names)
        self._waiting = list(runs)
        self._done: Dict[str, List[dict]] = {}
        self._failed: Dict[str, str] = {}
        self._launches = 0

    def of(self, name: str) -> List[Any]:
        """Each rank's result of run ``name``, in rank order.

        Raises:
            KeyError: No run is called ``name``.
            MultiRankError: The run did not finish on every rank; the
                message names it, the limits and holds every rank's log.
        """
        # pytest leaves these frames out of a failed test's traceback: the
        # message holds what matters.
        __tracebackhide__ = True
        return [saved['result'] for saved in self._saved(name)]

    def seconds(self, name: str) -> List[float]:
        """Each rank's wall time of run ``name`` (see :meth:`of`)."""
        __tracebackhide__ = True
        return [saved['seconds'] for saved in self._saved(name)]

    def _saved(self, name: str) -> List[dict]:
        __tracebackhide__ = True
        if name not in self.names:
            raise KeyError(f'no run called {name!r}; the runs are '
                           f'{self.names}')
        waiting = [run[0] for run in self._waiting]
        if name in waiting:
            start = waiting.index(name)
            self._waiting = self._waiting[:start] + self._launch(
                self._waiting[start:])
        if name in self._failed:
            raise MultiRankError(self._failed[name])
        return self._done[name]

    def _launch(self, runs: list) -> list:
        """Run ``runs`` in one launch; returns those it did not reach."""
        log_dir = osp.join(self.results_dir, f'launch{self._launches}')
        self._launches += 1
        os.makedirs(log_dir)
        error = None
        try:
            run_on_ranks(
                run_in_turn,
                self.world_size,
                args=(self.fn, self.args, runs, self.results_dir,
                      self.run_limit_s),
                timeout=self.launch_limit_s,
                log_dir=log_dir)
        except MultiRankError as failure:
            error = failure
        for index, run in enumerate(runs):
            name = run[0]
            ranks = [
                _saved(self.results_dir, name, rank)
                for rank in range(self.world_size)
            ]
            if None in ranks:
                self._failed[name] = (
                    f'{self.what} {name!r} did not finish on every rank '
                    f'(limits: {self.run_limit_s:.0f} s for the run, '
                    'checked in the ranks, where one past it exits with '
                    '"Timeout" and every thread\'s stack in its log; '
                    f'{self.launch_limit_s:.0f} s for the launch):\n{error}')
                return runs[index + 1:]
            self._done[name] = ranks
        return []
