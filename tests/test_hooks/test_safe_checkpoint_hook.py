"""SafeCheckpointHook: what ExtRunner's hooks leave in a checkpoint loads
with ``torch.load(weights_only=True)``; what stock MMEngine leaves does
not."""
import itertools
import pickle

import numpy as np
import pytest
import torch
from mmengine.logging import MessageHub
from mmengine.registry import HOOKS
from mmengine.runner import Runner

from mmddp_ext.runner.ext_runner import ExtRunner
from ..helpers import ToyModel


_HUB_NAMES = (f'test_safe_checkpoint_hook_{i}' for i in itertools.count())


def _checkpoint():
    """What ``Runner.save_checkpoint`` hands to the hooks: the message
    hub's state (HistoryBuffer objects, numpy values) and the weights."""
    hub = MessageHub.get_instance(next(_HUB_NAMES))
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_info('best_score', np.float64(0.5))
    return dict(
        meta=dict(iter=3),
        state_dict=dict(w=torch.ones(2)),
        message_hub=hub.state_dict())


def _saved_and_loaded(runner_cls, tmp_path):
    runner = runner_cls(model=ToyModel(), work_dir=str(tmp_path))
    checkpoint = _checkpoint()
    runner.call_hook('before_save_checkpoint', checkpoint=checkpoint)
    path = tmp_path / 'ckpt.pth'
    torch.save(checkpoint, path)
    return torch.load(path, weights_only=True)


def test_ext_runner_checkpoints_load_weights_only(tmp_path):
    loaded = _saved_and_loaded(ExtRunner, tmp_path)
    history = loaded['message_hub']['log_scalars']['train/loss']
    assert len(history['log_history']) == 3
    assert loaded['message_hub']['runtime_info']['best_score'] == 0.5
    assert torch.equal(loaded['state_dict']['w'], torch.ones(2))


def test_stock_runner_checkpoints_do_not(tmp_path):
    """The control: the same checkpoint through stock Runner's hooks."""
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        _saved_and_loaded(Runner, tmp_path)


def test_registered_and_restores_the_history_on_load(tmp_path):
    hook = HOOKS.build(dict(type='SafeCheckpointHook'))
    checkpoint = _checkpoint()
    hook.before_save_checkpoint(None, checkpoint)
    torch.save(checkpoint, tmp_path / 'ckpt.pth')
    loaded = torch.load(tmp_path / 'ckpt.pth', weights_only=True)
    hook.after_load_checkpoint(None, loaded)
    hub = MessageHub.get_instance(next(_HUB_NAMES))
    hub.load_state_dict(loaded['message_hub'])
    assert hub.get_scalar('train/loss').data[0].tolist() == [
        1.0, 0.5, 1 / 3
    ]
