"""``EpochPolicyDataset`` runs, epoch by epoch, the ops upstream's
transforms ``Compose`` runs.

Expected values: the ``policy_table`` of every D-FINE and DEIM config in
``data/upstream_recipes.json``: upstream's own ``Compose`` (each
repository's ``data/transforms/container.py``) with its config's
``policy`` and ``mosaic_prob``, run on stand-in ops named as upstream's
transform classes, 400 samples per epoch. Here the same policy drives
stand-ins named as this port's pipeline types.
"""
import random

import pytest
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmengine.dataset import BaseDataset

from . import upstream_recipes as upstream
from .deim_utils import import_deim

# upstream transform class -> this port's pipeline type
PORT_TYPES = {
    'Mosaic': 'DEIMMosaic',
    'RandomPhotometricDistort': 'PhotoMetricDistortion',
    'RandomZoomOut': 'Expand',
    'RandomIoUCrop': 'RandomIoUCrop',
}
DRAWS = 400


class Record(BaseTransform):
    """Appends its name to ``results['ran']``."""
    name = None

    def transform(self, results):
        results.setdefault('ran', []).append(self.name)
        return results


class RecordMosaic(Record):
    name = 'DEIMMosaic'

    def get_indexes(self, dataset):
        return [0, 0, 0]


def _stand_ins():
    """``{port type: registered stand-in type}``."""
    names = {}
    for port_type in list(PORT_TYPES.values()) + ['RandomFlip']:
        stand_in = f'PolicyRecord{port_type}'
        if TRANSFORMS.get(stand_in) is None:
            base = RecordMosaic if port_type == 'DEIMMosaic' else Record
            TRANSFORMS.register_module(
                name=stand_in,
                module=type(stand_in, (base, ), dict(name=port_type)))
        names[port_type] = stand_in
    return names


class Items(BaseDataset):

    def load_data_list(self):
        return [dict(index=i) for i in range(4)]


def build(yaml: dict, **policy_overrides):
    """The dataset with this config's policy over stand-in ops."""
    import_deim()
    from mmdet.registry import DATASETS
    stand_ins = _stand_ins()
    ops = [
        PORT_TYPES[op['type']]
        for op in yaml['ops'] if op['type'] in PORT_TYPES
    ] + ['RandomFlip']
    policy = dict(
        yaml['policy'],
        ops=[stand_ins[PORT_TYPES[op]] for op in yaml['policy']['ops']])
    policy.update(policy_overrides)
    mosaic_prob = yaml['mosaic_prob']
    return DATASETS.build(
        dict(
            type='EpochPolicyDataset',
            dataset=Items(serialize_data=False),
            pipeline=[dict(type=stand_ins[op]) for op in ops],
            policy=policy,
            mosaic_prob=-0.1 if mosaic_prob is None else mosaic_prob,
            mosaic_type=stand_ins['DEIMMosaic'],
            mosaic_excludes=(stand_ins['Expand'], stand_ins['RandomIoUCrop'])))


def port_sequences(row_sequences):
    """Upstream's op sequences as this port's policy-op sequences."""
    return sorted({
        tuple(PORT_TYPES[op]
              for op in seq if op in PORT_TYPES) + ('RandomFlip', )
        for seq in row_sequences
    })


def all_configs():
    for repository in (upstream.DFINE, upstream.DEIM):
        for yml, record in upstream.configs(repository).items():
            yield pytest.param(record, id=f'{repository}/{yml}')


@pytest.mark.parametrize('record', all_configs())
def test_ops_per_epoch_equal_upstream(record):
    dataset = build(record['yaml'])
    random.seed(0)
    for row in record['policy_table']:
        for epoch in sorted(set(row['epochs'])):
            dataset.set_epoch(epoch)
            seen, mosaics = set(), 0
            for _ in range(DRAWS):
                ran = tuple(dataset[0]['ran'])
                seen.add(ran)
                mosaics += 'DEIMMosaic' in ran
            assert sorted(seen) == port_sequences(row['sequences']), epoch
            share = row['mosaic_draws'] / row['draws']
            assert abs(mosaics / DRAWS - share) < 0.1, epoch


def test_set_epoch_reports_stage_changes():
    record = upstream.recipe(upstream.DEIM,
                             'configs/deim_dfine/deim_hgnetv2_l_coco.yml')
    dataset = build(record['yaml'])
    first, second, last = record['yaml']['policy']['epoch']
    changes = [
        e for e in range(record['yaml']['epochs']) if dataset.set_epoch(e)
    ]
    assert changes == [first, second, last]
    # a resumed run's first set_epoch already changes the stage
    resumed = build(record['yaml'])
    assert resumed.set_epoch(second + 1)


def test_policy_config_errors():
    record = upstream.recipe(upstream.DEIM,
                             'configs/deim_dfine/deim_hgnetv2_l_coco.yml')
    with pytest.raises(ValueError, match='not types in the pipeline'):
        build(record['yaml'], ops=['Mosaic'])
    with pytest.raises(ValueError, match='three increasing'):
        build(record['yaml'], epoch=[4, 29])
