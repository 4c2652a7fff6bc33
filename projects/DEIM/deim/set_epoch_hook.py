"""Upstream's ``train_dataloader.set_epoch(epoch)`` as an MMEngine hook."""
from typing import Iterator

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


def _datasets(dataset) -> Iterator:
    """``dataset`` and the datasets it wraps (``.dataset``, ``.datasets``)."""
    yield dataset
    inner = getattr(dataset, 'dataset', None)
    if inner is not None:
        yield from _datasets(inner)
    for part in getattr(dataset, 'datasets', None) or ():
        yield from _datasets(part)


@HOOKS.register_module()
class SetEpochHook(Hook):
    """Tell the train data and the batch augments which epoch starts.

    Upstream D-FINE / DEIM call ``train_dataloader.set_epoch(epoch)``
    before every epoch, which passes the epoch to the dataset (its
    transforms ``policy``) and to the collate function (MixUp window,
    multi-scale stop); DEIMv2's solver also passes it to the criterion,
    whose matcher changes its cost at an epoch. Here, before every train
    epoch and on every rank, ``set_epoch(runner.epoch)`` is called on each
    dataset in the train loader (wrappers included, e.g.
    :class:`EpochPolicyDataset`), on each of the model's
    ``data_preprocessor.batch_augments`` that has it (e.g.
    :class:`CollateBatchAugment`) and on every other submodule of the
    model that has it (e.g. DEIMv2's head, for its matcher), once each.
    The epoch comes from the runner, the same on every rank, so a resumed
    run continues with the policy and matching of the epoch it resumes
    at. When a dataset's ``set_epoch`` returns True (the ops of its
    samples change) and the loader keeps persistent workers, the workers
    are restarted so that they see it (mmdet's ``PipelineSwitchHook``
    does the same for a new pipeline).
    """

    priority = 'NORMAL'

    def before_train_epoch(self, runner) -> None:
        """Set the epoch on the data, the batch augments and the model's
        modules that take it."""
        epoch = runner.epoch
        loader = runner.train_dataloader
        changed = False
        for dataset in _datasets(loader.dataset):
            if hasattr(dataset, 'set_epoch'):
                changed |= bool(dataset.set_epoch(epoch))
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        preprocessor = getattr(model, 'data_preprocessor', None)
        augments = list(getattr(preprocessor, 'batch_augments', None) or ())
        told = set()
        for part in augments + list(model.modules()):
            if id(part) not in told and hasattr(part, 'set_epoch'):
                told.add(id(part))
                part.set_epoch(epoch)
        if changed and getattr(loader, 'persistent_workers', False):
            # the next iter(loader) starts new workers (torch's DataLoader
            # keeps persistent ones in _iterator)
            loader._iterator = None
            print_log(
                f'SetEpochHook: the data policy changes at epoch {epoch}; '
                'restarting the persistent data workers.',
                logger='current')
