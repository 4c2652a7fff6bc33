"""The epoch ``policy`` of upstream D-FINE / DEIM train transforms on a
``MultiImageMixDataset``."""
import random
from typing import Dict, FrozenSet, Optional, Sequence, Union

from mmdet.datasets import MultiImageMixDataset
from mmdet.registry import DATASETS


@DATASETS.register_module()
class EpochPolicyDataset(MultiImageMixDataset):
    """``MultiImageMixDataset`` whose pipeline skips the ``policy`` ops as
    upstream's transforms ``Compose`` does (``policy: {name: stop_epoch,
    epoch, ops}``, ``engine/data/transforms/container.py`` of DEIM).

    ``policy['epoch']`` is either

    - an int ``e`` (D-FINE, RT-DETRv2): the ops run before epoch ``e`` and
      not from it on;
    - three epochs ``[e0, e1, e2]`` (DEIM): no op before ``e0``; in
      ``[e0, e1)`` each sample draws ``random.random() <= mosaic_prob``:
      with it, the mosaic runs and the ``mosaic_excludes`` ops do not;
      without it, the other way round; in ``[e1, e2)`` every op but the
      mosaic; from ``e2`` on, none.

    Epochs are 0-based, as upstream's and MMEngine's. The epoch is set by
    :meth:`set_epoch` (upstream: ``DataLoader.set_epoch`` ->
    ``dataset.set_epoch``), which :class:`SetEpochHook` calls before every
    train epoch; it returns whether the ops a sample may run changed, so
    the hook can restart persistent workers (their copies of the dataset
    keep the epoch they were started with). Ops are named by their
    pipeline ``type``.

    Args:
        dataset (dict | BaseDataset): The dataset, with the loading
            pipeline (``LoadImageFromFile``, ``LoadAnnotations``).
        pipeline (Sequence[dict]): The train transforms, upstream's
            ``ops`` in upstream's order.
        policy (dict): ``epoch`` (int or three ints) and ``ops`` (list of
            pipeline types switched by it); ``name`` may be given as
            upstream's ``'stop_epoch'``.
        mosaic_prob (float): Probability of the mosaic in ``[e0, e1)``
            (upstream ``mosaic_prob``). Defaults to -0.1, upstream's
            default (never).
        mosaic_type (str): Pipeline type of the mosaic. Defaults to
            ``'DEIMMosaic'``.
        mosaic_excludes (Sequence[str]): Pipeline types that do not run on
            a mosaic sample (upstream: ``RandomZoomOut``, ``RandomIoUCrop``).
            Defaults to ``('Expand', 'RandomIoUCrop')``.
        **kwargs: Other keys of ``MultiImageMixDataset`` (``max_refetch``,
            ``lazy_init``). ``skip_type_keys`` is set by the policy.
    """

    def __init__(self,
                 dataset,
                 pipeline: Sequence[dict],
                 policy: Dict,
                 mosaic_prob: float = -0.1,
                 mosaic_type: str = 'DEIMMosaic',
                 mosaic_excludes: Sequence[str] = ('Expand', 'RandomIoUCrop'),
                 **kwargs) -> None:
        if 'skip_type_keys' in kwargs:
            raise ValueError(
                'EpochPolicyDataset sets skip_type_keys from its policy; '
                'remove skip_type_keys from the config.')
        super().__init__(dataset, pipeline, **kwargs)
        self.policy_epoch = _check_policy(policy, self.pipeline_types)
        self.policy_ops = frozenset(policy['ops'])
        self.mosaic_prob = mosaic_prob
        self.mosaic_type = mosaic_type
        self.mosaic_excludes = frozenset(mosaic_excludes)
        self.epoch = -1

    def stage(self, epoch: int) -> int:
        """Index of the policy stage of ``epoch`` (0 before the first
        switch); the ops a sample may run depend on it only."""
        epochs = self.policy_epoch
        if isinstance(epochs, int):
            return int(epoch >= epochs)
        return sum(epoch >= e for e in epochs)

    def set_epoch(self, epoch: int) -> bool:
        """Set the epoch; True when its stage differs from the last one."""
        changed = self.stage(epoch) != self.stage(self.epoch)
        self.epoch = epoch
        return changed

    def skipped_ops(self) -> FrozenSet[str]:
        """The policy ops one sample skips at ``self.epoch`` (draws the
        mosaic in its stage, as upstream, once per sample)."""
        epochs = self.policy_epoch
        if isinstance(epochs, int):
            return self.policy_ops if self.epoch >= epochs else frozenset()
        first, mosaic_end, last = epochs
        if self.epoch < first or self.epoch >= last:
            return self.policy_ops
        with_mosaic = (
            self.epoch < mosaic_end and random.random() <= self.mosaic_prob)
        if with_mosaic:
            return self.mosaic_excludes & self.policy_ops
        return frozenset({self.mosaic_type}) & self.policy_ops

    def __getitem__(self, idx: int) -> dict:
        """``MultiImageMixDataset.__getitem__`` with this sample's skipped
        ops (see the class doc)."""
        self._skip_type_keys = self.skipped_ops()
        return super().__getitem__(idx)

    def update_skip_type_keys(self, skip_type_keys) -> None:
        """Refused: the policy decides what is skipped."""
        raise TypeError(
            'EpochPolicyDataset skips ops by its policy (set_epoch); a hook '
            'that calls update_skip_type_keys (YOLOXModeSwitchHook) would '
            'be overridden at the next sample. Set the policy instead.')


def _check_policy(policy: Dict,
                  pipeline_types: Sequence[str]) -> Union[int, tuple]:
    """The policy's epoch(s), after checking the config."""
    if not isinstance(policy,
                      dict) or 'epoch' not in policy or ('ops' not in policy):
        raise ValueError(
            'EpochPolicyDataset policy must be a dict with epoch (an int, '
            'or [e0, e1, e2] for DEIM) and ops (pipeline types), e.g. '
            "dict(epoch=[4, 29, 50], ops=['DEIMMosaic', "
            "'PhotoMetricDistortion', 'Expand', 'RandomIoUCrop']); got "
            f'{policy!r}.')
    name = policy.get('name', 'stop_epoch')
    if name != 'stop_epoch':
        raise ValueError(
            f"EpochPolicyDataset implements upstream's 'stop_epoch' policy, "
            f'got name={name!r}.')
    epoch: Optional[Union[int, tuple]] = policy['epoch']
    if isinstance(epoch, (list, tuple)):
        if len(epoch) != 3 or list(epoch) != sorted(epoch):
            raise ValueError(
                'policy.epoch as a list must be three increasing epochs '
                f'[e0, e1, e2] (DEIM), got {epoch!r}.')
        epoch = tuple(int(e) for e in epoch)
    elif not isinstance(epoch, int):
        raise TypeError(
            f'policy.epoch must be an int or three ints, got {epoch!r}.')
    missing = sorted(set(policy['ops']) - set(pipeline_types))
    if missing:
        raise ValueError(
            f'policy.ops {missing} are not types in the pipeline '
            f'{list(pipeline_types)}: they would never be switched. Name '
            'the pipeline types (e.g. PhotoMetricDistortion, Expand).')
    return epoch
