"""DINO heads that skip the denoising loss when the batch has no dn query.

A natural extension (and what RT-DETR v1's criterion does: no dn outputs,
no dn loss): when ``dn_meta['num_denoising_queries'] == 0``,
``split_outputs`` reports no dn part, so ``loss_by_feat`` computes no dn
terms and issues none of their ``reduce_mean`` all-reduces. With mmdet's
``CdnQueryGenerator`` a GT-less rank then runs other collectives than its
peers; with ``DDPSafeCdnQueryGenerator`` every rank has 2 dn queries and
takes the same path. Importing this module registers both heads.
"""
from mmdet.models.dense_heads import DINOHead
from mmdet.registry import MODELS

from mmddp_ext.models import DDPSafeDINOHead


class _SkipEmptyDnPart:
    """Mixin: no dn part in the outputs when there are no dn queries."""

    @staticmethod
    def split_outputs(all_layers_cls_scores, all_layers_bbox_preds,
                      dn_meta):
        parts = DINOHead.split_outputs(all_layers_cls_scores,
                                       all_layers_bbox_preds, dn_meta)
        if dn_meta is not None and dn_meta['num_denoising_queries'] == 0:
            matching_cls_scores, matching_bbox_preds, _, _ = parts
            return matching_cls_scores, matching_bbox_preds, None, None
        return parts


@MODELS.register_module()
class DINOHeadSkippingEmptyDn(_SkipEmptyDnPart, DINOHead):
    """mmdet's DINOHead, skipping an empty dn part."""


@MODELS.register_module()
class DDPSafeDINOHeadSkippingEmptyDn(_SkipEmptyDnPart, DDPSafeDINOHead):
    """DDPSafeDINOHead, skipping an empty dn part (never empty with the
    DDP-safe generator)."""
