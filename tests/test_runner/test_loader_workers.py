"""Training stops the dataloader workers it leaves running, as it ends or
fails. Left to the garbage collector inside the runner's reference cycles
(or a traceback's), they stall whatever runs next 5 s per worker: the
collector closes their queues before it asks them to stop (measured: 10 s
for 2 persistent workers, 60 s of one suite file)."""
import multiprocessing

import pytest

from mmddp_ext.runner import resumable_epoch_loop
from mmddp_ext.runner.ext_runner import ExtRunner
from mmddp_ext.utils.torch_private import stop_loader_workers
from .exact_resume.test_exact_resume import _cfg, _train


def _new_children(before):
    return [p for p in multiprocessing.active_children() if p not in before]


@pytest.mark.parametrize('stopped', [True, False])
def test_persistent_workers_stop_when_training_ends(tmp_path, monkeypatch,
                                                    stopped):
    """The control (``stopped=False``, the stop switched off): the
    workers outlive ``train()``, as with MMEngine's runner."""
    if not stopped:
        monkeypatch.setattr(ExtRunner, '_stop_loader_workers',
                            lambda self: None)
    before = multiprocessing.active_children()
    runner = _train(_cfg(tmp_path, workers=2, persistent=True))
    left = _new_children(before)
    if stopped:
        assert left == []
    else:
        assert len(left) == 2
        assert stop_loader_workers(runner.train_dataloader)
        assert _new_children(before) == []


@pytest.mark.parametrize('stopped', [True, False])
def test_a_failed_epochs_workers_stop(tmp_path, monkeypatch, stopped):
    """A run that raises mid-epoch (workers not persistent): its iterator
    lives on in the traceback; the control keeps its workers alive."""
    if not stopped:
        monkeypatch.setattr(resumable_epoch_loop, 'stop_loader_workers',
                            lambda batches: False)
    before = multiprocessing.active_children()
    with pytest.raises(RuntimeError, match='crash') as raised:
        _train(
            _cfg(
                tmp_path,
                workers=2,
                extra_hooks=[dict(type='CrashAtIterationHook',
                                  iteration=3)]))
    left = _new_children(before)
    assert len(left) == (0 if stopped else 2)
    del raised  # the traceback, and the control's iterator with it
    for process in left:
        process.terminate()
        process.join(5)
