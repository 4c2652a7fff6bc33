"""DEIM's criterion on the D-FINE head."""
from typing import Dict

from mmdet.registry import MODELS
from torch import Tensor

from .matchability_aware_loss import MatchabilityAwareLoss
from .ports import DFINEHead


@MODELS.register_module()
class DEIMHead(DFINEHead):
    """:class:`DFINEHead` with upstream DEIM's criterion
    (``DEIMCriterion`` with ``losses: ['mal', 'boxes', 'local']``).

    What DEIM changes in D-FINE's criterion, and how it is done here:

    - the classification term is MAL (``loss_cls`` must be a
      :class:`MatchabilityAwareLoss`, ``gamma`` 1.5), keyed ``loss_mal``
      (upstream's name) instead of ``loss_vfl``; it is computed on each
      output's own matching and divided by the GT count averaged over
      ranks, exactly where D-FINE's VFL is;
    - the last dn layer has no ``loss_ddf`` (DEIM computes DDF only when
      the teacher differs from the student; D-FINE adds an exact 0);
    - Dense O2O (more GT per image for the one-to-one matching) is not in
      the criterion but in the data: Mosaic and MixUp, switched by the
      epoch policy (:class:`EpochPolicyDataset`,
      :class:`CollateBatchAugment`).

    Everything else is :class:`DFINEHead`: the union matching for boxes,
    FGL and DDF, the normalisers taken over ranks, and DDP safety on
    batches without GT (a zero-weight dummy dn group, the same loss keys on
    every rank; upstream DEIM's denoising returns None on such a batch, so
    that rank's loss dict is shorter).

    Args:
        **kwargs: Keys of :class:`DFINEHead`; ``loss_cls`` defaults to
            ``dict(type='MatchabilityAwareLoss', gamma=1.5)``.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self,
                 *args,
                 loss_cls: dict = dict(
                     type='MatchabilityAwareLoss', gamma=1.5, loss_weight=1.0),
                 **kwargs) -> None:
        super().__init__(*args, loss_cls=loss_cls, **kwargs)
        if not isinstance(self.loss_cls, MatchabilityAwareLoss):
            raise TypeError(
                'DEIMHead trains with DEIM\'s matchability-aware loss: set '
                "bbox_head.loss_cls=dict(type='MatchabilityAwareLoss', "
                f'gamma=1.5), got {type(self.loss_cls).__name__}. For '
                "D-FINE's varifocal loss use type='DFINEHead'.")

    def _output_losses(self,
                       *args,
                       zero_ddf: bool = False,
                       **kwargs) -> Dict[str, Tensor]:
        """``DFINEHead._output_losses`` with the classification key named
        ``loss_mal`` and no DDF term for the last dn layer (see the class
        doc)."""
        losses = super()._output_losses(*args, zero_ddf=False, **kwargs)
        return {
            key.replace('loss_vfl', 'loss_mal', 1): value
            for key, value in losses.items()
        }
