"""empty_gt_guard_collate on real PackDetInputs batches."""
import logging
import multiprocessing
import pickle
from functools import partial

import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MMLogger
from mmengine.registry import FUNCTIONS
from torch.utils.data import DataLoader, SequentialSampler

from mmddp_ext.datasets import (AllEmptyGTBatchError, empty_gt_guard_collate,
                                num_gt_instances, reset_empty_gt_guard)
from mmddp_ext.datasets.empty_gt_guard_collate import GUARD_MARK_KEY
from .packed import PackedItemsDataset, packed_batch, packed_item

POLICIES = ('keep', 'swap', 'error')
KEPT = dict(all_empty=True, swapped=False, fallback=False)
SWAPPED = dict(all_empty=True, swapped=True, fallback=False)
FELL_BACK = dict(all_empty=True, swapped=False, fallback=True)


@pytest.fixture(autouse=True)
def fresh_guard_state():
    reset_empty_gt_guard()
    yield
    reset_empty_gt_guard()


class _Records(logging.Handler):

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def warnings_logged():
    logger = MMLogger.get_current_instance()
    handler = _Records()
    logger.addHandler(handler)
    yield handler.messages
    logger.removeHandler(handler)


def _marks(batch):
    return [getattr(s, GUARD_MARK_KEY, None) for s in batch['data_samples']]


def _img_ids(batch):
    return [s.img_id for s in batch['data_samples']]


def _same_samples(batch, items):
    return len(batch['data_samples']) == len(items) and all(
        out is item['data_samples']
        for out, item in zip(batch['data_samples'], items))


def test_registered_where_runner_looks_it_up():
    assert FUNCTIONS.get('empty_gt_guard_collate') is empty_gt_guard_collate


def test_num_gt_instances_tells_empty_from_unannotated():
    assert num_gt_instances(packed_item(3)['data_samples']) == 3
    assert num_gt_instances(packed_item(0)['data_samples']) == 0
    test_sample = packed_item(0, with_annotations=False)['data_samples']
    assert num_gt_instances(test_sample) is None


@pytest.mark.parametrize('policy', POLICIES)
def test_batch_with_a_box_is_exactly_pseudo_collate(policy):
    batch = packed_batch([0, 2, 0])
    out = empty_gt_guard_collate(batch, policy=policy)
    ref = pseudo_collate(batch)
    assert type(out) is type(ref) and list(out) == list(ref)
    for key in ref:
        assert len(out[key]) == len(ref[key])
        assert all(a is b for a, b in zip(out[key], ref[key]))
    assert _marks(out) == [None, None, None]


def test_other_values_are_collated_as_pseudo_collate_does():
    batch = packed_batch([1, 0])
    for i, item in enumerate(batch):
        item.update(
            number=i,
            name=f'n{i}',
            pair=(i, torch.tensor([i])),
            nested=dict(value=torch.ones(2) * i, tags=['a', f'b{i}']))
    out = empty_gt_guard_collate(batch, policy='swap')
    ref = pseudo_collate(batch)
    assert repr(out) == repr(ref)


def test_keep_passes_an_all_empty_batch_through_and_marks_it():
    batch = packed_batch([0, 0])
    out = empty_gt_guard_collate(batch, policy='keep')
    assert _same_samples(out, batch)
    assert all(a is b['inputs'] for a, b in zip(out['inputs'], batch))
    assert _marks(out) == [KEPT, KEPT]


def test_swap_replaces_one_sample_with_a_copy_from_the_reservoir():
    warm = packed_batch([0, 2], first_id=10)
    empty_gt_guard_collate(warm, policy='swap')
    empty = packed_batch([0, 0], first_id=20)
    out = empty_gt_guard_collate(empty, policy='swap')

    assert len(out['inputs']) == len(out['data_samples']) == 2
    assert _img_ids(out) == [20, 11]
    assert out['data_samples'][0] is empty[0]['data_samples']
    swapped_in, original = out['data_samples'][1], warm[1]['data_samples']
    assert swapped_in is not original
    assert num_gt_instances(swapped_in) == 2
    torch.testing.assert_close(swapped_in.gt_instances.bboxes.tensor,
                               original.gt_instances.bboxes.tensor)
    assert torch.equal(out['inputs'][1], warm[1]['inputs'])
    assert out['inputs'][1] is not warm[1]['inputs']
    assert _marks(out) == [SWAPPED, SWAPPED]
    # The reservoir's sample (and so the earlier batch) is not marked.
    assert getattr(original, GUARD_MARK_KEY, None) is None


def test_swap_draws_from_the_most_recent_annotated_samples():
    for first_id in (0, 10, 20, 30):
        empty_gt_guard_collate(
            packed_batch([1, 0], first_id=first_id),
            policy='swap',
            reservoir_size=2)
    drawn = set()
    for i in range(24):
        out = empty_gt_guard_collate(
            packed_batch([0, 0], first_id=100 + 2 * i),
            policy='swap',
            reservoir_size=2)
        drawn.add(_img_ids(out)[-1])
    assert drawn == {20, 30}


def test_swap_falls_back_until_the_reservoir_has_a_sample(warnings_logged):
    first = packed_batch([0, 0])
    out = empty_gt_guard_collate(first, policy='swap')
    assert _same_samples(out, first)
    assert _marks(out) == [FELL_BACK, FELL_BACK]
    out = empty_gt_guard_collate(packed_batch([0, 0], 2), policy='swap')
    assert _marks(out)[0]['fallback'] is True
    assert len(warnings_logged) == 1
    assert 'has not seen an annotated sample' in warnings_logged[0]

    empty_gt_guard_collate(packed_batch([0, 3], 4), policy='swap')
    out = empty_gt_guard_collate(packed_batch([0, 0], 6), policy='swap')
    assert _img_ids(out) == [6, 5]
    assert _marks(out)[0] == SWAPPED
    assert len(warnings_logged) == 1


@pytest.mark.parametrize('policy', ['keep', 'error'])
def test_keep_and_error_do_not_hold_samples(policy):
    """Only 'swap' keeps annotated samples: after 'keep'/'error' saw boxes,
    a 'swap' of an all-empty batch finds an empty reservoir."""
    out = empty_gt_guard_collate(packed_batch([2, 2]), policy=policy)
    assert _marks(out) == [None, None]
    out = empty_gt_guard_collate(packed_batch([0, 0], 2), policy='swap')
    assert _marks(out)[0] == FELL_BACK
    assert _img_ids(out) == [2, 3]


def test_swap_holds_the_samples_it_saw():
    """The control of the test above: the same sequence with 'swap' first
    does fill the reservoir."""
    empty_gt_guard_collate(packed_batch([2, 2]), policy='swap')
    out = empty_gt_guard_collate(packed_batch([0, 0], 2), policy='swap')
    assert _marks(out)[0] == SWAPPED


def test_error_policy_names_the_images():
    with pytest.raises(AllEmptyGTBatchError) as info:
        empty_gt_guard_collate(packed_batch([0, 0], 7), policy='error')
    message = str(info.value)
    assert 'img7.png, img8.png' in message
    assert "policy='swap'" in message


@pytest.mark.parametrize('policy', POLICIES)
def test_unannotated_batches_are_not_touched(policy):
    batch = [packed_item(0, i, with_annotations=False) for i in range(2)]
    out = empty_gt_guard_collate(batch, policy=policy)
    assert _same_samples(out, batch)
    assert _marks(out) == [None, None]


ONE_OF_POLICIES = "policy must be one of ('keep', 'swap', 'error')"
INT_SIZE = 'reservoir_size must be an int >= 1'


@pytest.mark.parametrize('kwargs, fragments', [
    (dict(policy='replace'), [ONE_OF_POLICIES, "got 'replace'"]),
    (dict(policy=None), [ONE_OF_POLICIES, 'got None']),
    (dict(policy=['swap']), [ONE_OF_POLICIES, "got ['swap']"]),
    (dict(reservoir_size=0), [INT_SIZE, 'got 0 (int)']),
    (dict(reservoir_size='4'), [INT_SIZE, "got '4' (str)"]),
    (dict(reservoir_size=True), [INT_SIZE, 'got True (bool)']),
    (dict(reservoir_size=2.0), [INT_SIZE, 'got 2.0 (float)']),
    (dict(polcy='swap'),
     ["unknown key(s) ['polcy']", "keys are 'policy' and 'reservoir_size'"]),
])
def test_bad_config_raises_value_error_naming_key_and_values(
        kwargs, fragments):
    collate = partial(FUNCTIONS.get('empty_gt_guard_collate'), **kwargs)
    with pytest.raises(ValueError) as info:
        collate(packed_batch([1, 0]))
    message = str(info.value)
    assert message.startswith('train_dataloader.collate_fn')
    for fragment in fragments:
        assert fragment in message


def test_items_that_are_not_packed_dicts_raise_type_error():
    with pytest.raises(TypeError, match='PackDetInputs'):
        empty_gt_guard_collate([(torch.zeros(1), 0), (torch.ones(1), 1)])


def test_config_and_marked_batches_pickle():
    collate = partial(
        FUNCTIONS.get('empty_gt_guard_collate'),
        policy='swap',
        reservoir_size=3)
    restored = pickle.loads(pickle.dumps(collate))
    assert restored.func is empty_gt_guard_collate
    assert restored.keywords == dict(policy='swap', reservoir_size=3)
    restored(packed_batch([1, 0]))
    out = pickle.loads(pickle.dumps(restored(packed_batch([0, 0], 2))))
    assert _img_ids(out) == [2, 0]
    assert _marks(out)[1] == SWAPPED


def _collate_empty_batch_in_child(conn):
    out = empty_gt_guard_collate(packed_batch([0, 0], 50), policy='swap')
    conn.send(_marks(out)[0])
    conn.close()


def test_forked_process_starts_with_an_empty_reservoir():
    empty_gt_guard_collate(packed_batch([1, 0]), policy='swap')
    ctx = multiprocessing.get_context('fork')
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(
        target=_collate_empty_batch_in_child, args=(child_end, ))
    child.start()
    assert parent_end.poll(30), 'forked child did not answer'
    child_mark = parent_end.recv()
    child.join(10)
    assert child_mark == FELL_BACK
    # The parent's own reservoir is still warm.
    out = empty_gt_guard_collate(packed_batch([0, 0], 60), policy='swap')
    assert _marks(out)[0]['swapped'] is True


# Batches of 2 over 16 samples: batches 0 and 1 have no box, 2 and 3 do.
LOADER_GT_COUNTS = [0, 0, 0, 0, 2, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0]


def _expected_marks(num_workers, persistent, epochs=2, batch_size=2):
    """Which batches each epoch swaps or falls back: DataLoader hands
    batch k to worker k % num_workers, and a worker can swap once it has
    collated a sample with a box (in this epoch, or an earlier one if its
    process persists)."""
    counts = LOADER_GT_COUNTS
    batches = [
        counts[i:i + batch_size] for i in range(0, len(counts), batch_size)
    ]
    expected, warm = [], set()
    for _ in range(epochs):
        warm = warm if persistent else set()
        swapped, fallback = set(), set()
        for k, batch in enumerate(batches):
            worker = k % num_workers
            if any(batch):
                warm.add(worker)
            elif worker in warm:
                swapped.add(k)
            else:
                fallback.add(k)
        expected.append((swapped, fallback))
    return expected


@pytest.mark.parametrize('start_method, num_workers, persistent', [
    ('fork', 2, True),
    ('fork', 2, False),
    ('spawn', 1, True),
])
def test_dataloader_workers_keep_batches_and_reservoirs(
        start_method, num_workers, persistent):
    dataset = PackedItemsDataset(LOADER_GT_COUNTS)
    loader = DataLoader(
        dataset,
        batch_size=2,
        sampler=SequentialSampler(dataset),
        num_workers=num_workers,
        persistent_workers=persistent,
        multiprocessing_context=start_method,
        collate_fn=partial(
            FUNCTIONS.get('empty_gt_guard_collate'), policy='swap'))
    epochs = [list(loader) for _ in range(2)]

    expected = _expected_marks(num_workers, persistent)
    # The pattern exercises both outcomes, and persistence matters.
    assert expected[0][1] and expected[1][0]
    for batches, (swapped, fallback) in zip(epochs, expected):
        assert len(batches) == 8
        assert all(
            len(b['data_samples']) == len(b['inputs']) == 2 for b in batches)
        marks = [_marks(b)[0] or {} for b in batches]
        assert {k for k, m in enumerate(marks) if m.get('swapped')} == swapped
        assert {k
                for k, m in enumerate(marks) if m.get('fallback')} == fallback
        for k, batch in enumerate(batches):
            assert _img_ids(batch)[0] == 2 * k  # first sample never moves
            has_box = any(num_gt_instances(s) for s in batch['data_samples'])
            assert has_box == (k not in fallback)
