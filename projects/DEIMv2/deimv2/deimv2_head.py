"""DEIM's head with DEIMv2's shared per-layer branches and criterion
options."""
from typing import Dict, Sequence

from mmdet.registry import MODELS
from torch import Tensor

from .ports import DEIMHead

# Upstream DEIMCriterion ``losses`` this head computes: every size but the
# light ones, and Atto / Femto / Pico (no FGL / DDF).
LOSS_SETS = (('mal', 'boxes', 'local'), ('mal', 'boxes'))


@MODELS.register_module()
class DEIMv2Head(DEIMHead):
    """:class:`DEIMHead` (MAL, D-FINE's FGL / DDF, DDP-safe denoising,
    normalisers averaged over ranks) with upstream DEIMv2's options.

    Shared branches: the edge-distribution branches, and optionally the
    class branches, can be one module for every layer up to ``eval_idx``
    (upstream ``share_bbox_head`` / ``share_score_head``: Atto, Femto and
    Pico share the box branch). A shared branch is one module listed
    several times in ``reg_branches`` / ``cls_branches``: its parameters
    appear once in ``parameters()`` (once in DDP's buckets, once in the
    optimizer) and its state-dict entries under every index, as in
    upstream's checkpoints.

    Criterion options (upstream ``DEIMCriterion``; Atto, Femto and Pico
    set ``losses=['mal', 'boxes']`` and ``use_uni_set=False``):

    - ``losses`` without ``'local'``: no ``loss_fgl`` / ``loss_ddf`` term
      for any output; they are not computed (not weighted by 0), and the
      loss keys are the same on every rank;
    - ``use_uni_set=False``: the box terms (``loss_bbox``, ``loss_giou``)
      of each output use that output's own matching, divided by the GT
      count averaged over ranks, as its MAL term, instead of the union of
      the matchings of every layer, layer 0's box and the encoder, divided
      by the union's size. The dn outputs are unchanged (their pairs are
      the dn queries' own GT either way).

    Both act through ``_output_losses``, :class:`DFINEHead`'s per-output
    seam; the matching, the union and every normaliser (one
    ``reduce_mean`` a step on every rank) stay :class:`DFINEHead`'s.

    Matcher change (upstream ``change_matcher``): a
    ``train_cfg.assigner`` of type :class:`DEIMv2HungarianAssigner` holds
    ``change_matcher``, ``iou_order_alpha`` and ``matcher_change_epoch``;
    :meth:`set_epoch`, which :class:`SetEpochHook` calls before every
    training epoch, gives it the epoch.

    Args:
        share_bbox_head (bool): One edge-distribution branch for the
            layers ``0 .. eval_idx``. Defaults to False.
        share_score_head (bool): One class branch for those layers.
            Defaults to False.
        losses (Sequence[str]): Upstream ``DEIMCriterion.losses``:
            ``['mal', 'boxes', 'local']`` or ``['mal', 'boxes']`` (no FGL
            / DDF), in any order. Defaults to ``('mal', 'boxes',
            'local')``.
        use_uni_set (bool): The box (and FGL / DDF) terms on the union of
            the matchings of all outputs (True) or on each output's own
            matching (False). False needs ``losses`` without ``'local'``.
            Defaults to True.
        **kwargs: Keys of :class:`DEIMHead`.
    """
    # Its own path for a batch without GT is DDP-safe, so the doctor may
    # name it in a paste line (mmddp_ext.doctor.ddp_safe_types); a
    # subclass that keeps that path declares it again.
    ddp_safe_empty_gt = True

    def __init__(self,
                 *args,
                 share_bbox_head: bool = False,
                 share_score_head: bool = False,
                 losses: Sequence[str] = LOSS_SETS[0],
                 use_uni_set: bool = True,
                 **kwargs) -> None:
        self.share_bbox_head = share_bbox_head
        self.share_score_head = share_score_head
        self.losses = _checked_losses(losses)
        if not isinstance(use_uni_set, bool):
            raise TypeError('DEIMv2Head.use_uni_set must be True or False, '
                            f'got {use_uni_set!r}.')
        if not use_uni_set and 'local' in self.losses:
            # Upstream computes the FGL targets of the first output it
            # sees and reuses them for every output: with each output's
            # own matching they belong to other queries. No upstream
            # config combines the two.
            raise ValueError(
                'DEIMv2Head: use_uni_set=False needs losses without '
                f"'local', got losses={list(losses)!r}. Upstream's FGL "
                "targets assume one matching for every output. Use "
                "losses=['mal', 'boxes'] with use_uni_set=False (DEIMv2 "
                'Atto / Femto / Pico), or use_uni_set=True.')
        self.use_uni_set = use_uni_set
        super().__init__(*args, **kwargs)

    def _init_layers(self) -> None:
        """``DFINEHead._init_layers``, then the branches of layers
        ``1 .. eval_idx`` replaced by layer 0's where shared."""
        super()._init_layers()
        shared_layers = self.eval_idx % (self.num_pred_layer - 1) + 1
        for share, branches in ((self.share_bbox_head, self.reg_branches),
                                (self.share_score_head, self.cls_branches)):
            if share:
                for i in range(1, shared_layers):
                    branches[i] = branches[0]

    def set_epoch(self, epoch: int) -> None:
        """Give the training epoch that starts to the assigner (the
        matcher change of :class:`DEIMv2HungarianAssigner`); assigners
        without ``set_epoch`` ignore it. Called by :class:`SetEpochHook`.
        """
        set_epoch = getattr(getattr(self, 'assigner', None), 'set_epoch', None)
        if set_epoch is not None:
            set_epoch(epoch)

    def _output_losses(self, scores: Tensor, boxes: Tensor, corners, cls_pairs,
                       num_cls: Tensor, part: Dict, *args,
                       **kwargs) -> Dict[str, Tensor]:
        """``DEIMHead._output_losses`` with upstream's ``losses`` and
        ``use_uni_set`` (see the class doc): without ``'local'`` the output
        is passed without edge distributions (the FGL / DDF terms are then
        skipped), and with ``use_uni_set=False`` its box terms take the
        pairs and divisor of its classification term."""
        if 'local' not in self.losses:
            corners = None
        if not self.use_uni_set:
            part = dict(part, pairs=cls_pairs, num_boxes=num_cls)
        return super()._output_losses(scores, boxes, corners, cls_pairs,
                                      num_cls, part, *args, **kwargs)


def _checked_losses(losses: Sequence[str]) -> tuple:
    """``losses`` as one of :data:`LOSS_SETS`, or a ValueError."""
    names = tuple(losses) if isinstance(losses, (list, tuple)) else None
    for accepted in LOSS_SETS:
        if names is not None and sorted(names) == sorted(accepted):
            return accepted
    raise ValueError(
        'DEIMv2Head.losses must be one of upstream DEIMv2\'s criterion '
        f'loss sets {[list(s) for s in LOSS_SETS]} (any order), got '
        f"{losses!r}. ['mal', 'boxes'] drops FGL / DDF (Atto, Femto, "
        'Pico).')
