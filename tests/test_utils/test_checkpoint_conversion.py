"""The generic half of ``--to-upstream`` (mmddp_ext.utils.
checkpoint_conversion): which weights of an MMEngine checkpoint are the
raw ones and which the EMA's, the layout upstream's solvers save, and the
round-trip check; the families' tests run them on their own models."""
import types
from collections import OrderedDict

import pytest
import torch
from mmengine.config import Config
from mmengine.hooks import EMAHook

from mmddp_ext.utils import (CheckpointConversionError, compare_state_dicts,
                             convert_to_upstream_checkpoint,
                             drop_num_batches_tracked, upstream_eval_size)
from mmddp_ext.utils.checkpoint_conversion import split_mmengine_checkpoint


def emahook_checkpoint(raw: dict, ema: dict, steps: int) -> dict:
    """An MMEngine checkpoint of a model whose weights are ``raw`` and
    whose EMA's are ``ema``, as ``EMAHook.before_save_checkpoint`` (the
    real one) leaves it: it swaps the two, so ``state_dict`` holds the EMA
    weights and ``ema_state_dict`` the raw ones."""
    hook = EMAHook()
    averaged = OrderedDict(steps=torch.tensor(steps))
    averaged.update((f'module.{k}', v) for k, v in ema.items())
    hook.ema_model = types.SimpleNamespace(state_dict=lambda: averaged)
    checkpoint = {'meta': {'epoch': 3}, 'state_dict': OrderedDict(raw)}
    hook.before_save_checkpoint(None, checkpoint)
    return checkpoint


def _state(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        'conv.weight': torch.randn(2, 2, generator=gen),
        'bn.running_mean': torch.randn(2, generator=gen),
        'bn.num_batches_tracked': torch.tensor(seed)
    }


def test_emahooks_swap_is_undone():
    raw, ema = _state(1), _state(2)
    checkpoint = emahook_checkpoint(raw, ema, steps=40)
    # what EMAHook saved: the EMA weights where load_from reads
    assert checkpoint['state_dict']['conv.weight'] is ema['conv.weight']
    got_raw, got_ema, steps = split_mmengine_checkpoint(checkpoint)
    assert compare_state_dicts(raw, got_raw) == []
    assert compare_state_dicts(ema, got_ema) == []
    assert steps == 40

    assert split_mmengine_checkpoint({'state_dict': raw}) == (raw, None, None)
    del checkpoint['ema_state_dict']['module.bn.running_mean']
    with pytest.raises(CheckpointConversionError, match='bn.running_mean'):
        split_mmengine_checkpoint(checkpoint)


def test_upstream_layout_is_the_solvers():
    """``BaseSolver.state_dict`` of the four upstreams: ``date``,
    ``model``, and ``ema`` as ``ModelEMA.state_dict()``; without an EMA,
    no ``ema`` (upstream's ``-r`` then starts its EMA from ``model``)."""
    raw, ema = _state(1), _state(2)

    def rename(state, log):
        return {f'up.{k}': v for k, v in state.items()}

    lines = []
    upstream = convert_to_upstream_checkpoint(
        emahook_checkpoint(raw, ema, 7), rename, {'warmups': 2000},
        lines.append)
    assert set(upstream) == {'date', 'model', 'ema'}
    assert upstream['ema']['updates'] == 7 and isinstance(
        upstream['ema']['updates'], int)
    assert set(upstream['ema']) == {'module', 'updates', 'warmups'}
    assert upstream['model']['up.conv.weight'] is raw['conv.weight']
    assert upstream['ema']['module']['up.conv.weight'] is ema['conv.weight']
    assert 'the raw weights' in lines[-1]
    plain = convert_to_upstream_checkpoint({'state_dict': raw},
                                           rename,
                                           log=lines.append)
    assert set(plain) == {'date', 'model'} and 'no EMA' in lines[-1]


def test_compare_state_dicts_names_every_difference():
    expected = {
        'same': torch.tensor([0.5, float('nan')]),
        'zero': torch.tensor([0.0]),
        'dtype': torch.tensor([1]),
        'shape': torch.zeros(2, 3),
        'gone': torch.zeros(1)
    }
    actual = {
        'same': torch.tensor([0.5, float('nan')]),
        'zero': torch.tensor([-0.0]),  # equal to torch.equal, not bitwise
        'dtype': torch.tensor([1.0]),
        'shape': torch.zeros(3, 2),
        'new': torch.zeros(1)
    }
    assert compare_state_dicts(expected, actual) == [
        'missing: gone', 'extra: new', 'values: zero',
        'dtype: dtype torch.int64 -> torch.float32',
        'shape: shape (2, 3) -> (3, 2)'
    ]
    assert compare_state_dicts(expected, dict(expected)) == []


def test_frozen_counters_are_dropped_and_a_moved_one_is_said():
    state = {
        'backbone.bn.num_batches_tracked': torch.tensor(0),
        'backbone.gn.num_batches_tracked': torch.tensor(5),
        'backbone.bn.weight': torch.ones(1),
        'neck.bn.num_batches_tracked': torch.tensor(0)
    }
    lines = []
    kept = drop_num_batches_tracked(state, 'backbone.', lines.append)
    assert set(kept) == {'backbone.bn.weight', 'neck.bn.num_batches_tracked'}
    assert lines[1] == ('drop  backbone.gn.num_batches_tracked (frozen BN '
                        'upstream, was 5)')


def test_eval_size_from_the_test_resize():
    resize = dict(type='Resize', scale=(416, 320), keep_ratio=False)
    cfg = Config(dict(test_dataloader=dict(dataset=dict(pipeline=[resize]))))
    assert upstream_eval_size(cfg) == (320, 416)  # mmcv's scale is (w, h)
    assert upstream_eval_size(cfg, [512, 512]) == (512, 512)
    resize['keep_ratio'] = True
    with pytest.raises(CheckpointConversionError, match='--eval-size'):
        upstream_eval_size(
            Config(
                dict(test_dataloader=dict(dataset=dict(pipeline=[resize])))))
