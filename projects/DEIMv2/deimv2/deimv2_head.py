"""DEIM's head with DEIMv2's shared per-layer branches."""
from mmdet.registry import MODELS

from .ports import DEIMHead


@MODELS.register_module()
class DEIMv2Head(DEIMHead):
    """:class:`DEIMHead` (MAL, D-FINE's FGL / DDF, DDP-safe denoising,
    normalisers averaged over ranks) whose edge-distribution branches, and
    optionally class branches, can be one module for every layer up to
    ``eval_idx`` (upstream ``share_bbox_head`` / ``share_score_head``:
    Atto, Femto and Pico share the box branch).

    A shared branch is one module listed several times in
    ``reg_branches`` / ``cls_branches``: its parameters appear once in
    ``parameters()`` (once in DDP's buckets, once in the optimizer) and
    its state-dict entries under every index, as in upstream's
    checkpoints.

    Args:
        share_bbox_head (bool): One edge-distribution branch for the
            layers ``0 .. eval_idx``. Defaults to False.
        share_score_head (bool): One class branch for those layers.
            Defaults to False.
        **kwargs: Keys of :class:`DEIMHead`.
    """

    def __init__(self,
                 *args,
                 share_bbox_head: bool = False,
                 share_score_head: bool = False,
                 **kwargs) -> None:
        self.share_bbox_head = share_bbox_head
        self.share_score_head = share_score_head
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
