import os
import os.path as osp
from collections import OrderedDict

import numpy as np
import pytest
import torch
from mmengine.logging import HistoryBuffer, MessageHub

from mmddp_ext.hooks import SafeCheckpointHook
from mmddp_ext.utils.checkpoint_safety import (UnsafeCheckpointError,
                                               load_checkpoint_file,
                                               restore_history_buffers,
                                               to_plain)


class _RunsShellOnLoad:
    """A pickle payload that would run a command when unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


def _message_hub_state():
    hub = MessageHub.get_instance('test_checkpoint_safety')
    for i in range(5):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_info('iter', 5)
    hub.update_info('best_score', np.float64(0.5))
    return hub.state_dict()


def test_stock_message_hub_checkpoint_is_refused_naming_the_global(tmp_path):
    """What stock MMEngine writes cannot load with weights_only=True."""
    path = str(tmp_path / 'stock.pth')
    torch.save({'message_hub': _message_hub_state()}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint_file(path)
    message = str(info.value)
    assert path in message
    assert 'trusted_checkpoints' in message and '--trust-checkpoint' in message


def test_sanitised_checkpoint_loads_weights_only_and_roundtrips(tmp_path):
    state = _message_hub_state()
    checkpoint = {
        'meta': {'iter': 5, 'seed': np.int64(3), 'dataset_meta': {
            'classes': ('a', 'b'), 'palette': [(1, 2, 3)]}},
        'state_dict': OrderedDict(w=torch.ones(2)),
        'message_hub': state,
        'extra': object(),
    }
    SafeCheckpointHook().before_save_checkpoint(None, checkpoint)
    assert 'extra' not in checkpoint
    path = str(tmp_path / 'safe.pth')
    torch.save(checkpoint, path)
    loaded = load_checkpoint_file(path)  # weights_only=True
    SafeCheckpointHook().after_load_checkpoint(None, loaded)
    buffer = loaded['message_hub']['log_scalars']['train/loss']
    assert isinstance(buffer, HistoryBuffer)
    original = state['log_scalars']['train/loss']
    np.testing.assert_allclose(buffer.data[0], original.data[0])
    np.testing.assert_allclose(buffer.data[1], original.data[1])
    assert buffer.mean() == pytest.approx(original.mean())
    assert loaded['meta']['seed'] == 3 and isinstance(
        loaded['meta']['seed'], int)
    assert loaded['meta']['dataset_meta']['classes'] == ('a', 'b')
    assert loaded['message_hub']['runtime_info']['best_score'] == 0.5


def test_malicious_file_is_refused_without_running_it(tmp_path):
    marker = str(tmp_path / 'pwned')
    path = str(tmp_path / 'malicious.pth')
    torch.save({'state_dict': {}, 'payload': _RunsShellOnLoad(marker)}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint_file(path)
    assert 'system' in str(info.value)  # names the offending global
    assert not osp.exists(marker)


def test_explicit_trust_opt_in_loads_a_legacy_file(tmp_path, monkeypatch):
    path = str(tmp_path / 'legacy.pth')
    torch.save({'message_hub': _message_hub_state()}, path)
    loaded = load_checkpoint_file(path, trusted=[path])
    assert isinstance(loaded['message_hub']['log_scalars']['train/loss'],
                      HistoryBuffer)
    monkeypatch.setenv('MMDDP_EXT_TRUSTED_CHECKPOINTS', path)
    assert 'message_hub' in load_checkpoint_file(path)
    # Trusting another file does not trust this one.
    monkeypatch.delenv('MMDDP_EXT_TRUSTED_CHECKPOINTS')
    with pytest.raises(UnsafeCheckpointError):
        load_checkpoint_file(path, trusted=[str(tmp_path / 'other.pth')])


def test_to_plain_keeps_tensors_and_containers():
    value = {'a': [torch.zeros(1), (1, 'x')], 'b': np.arange(3)}
    plain = to_plain(value)
    assert torch.equal(plain['b'], torch.arange(3))
    assert plain['a'][1] == (1, 'x')
    assert restore_history_buffers(plain) is plain
