"""Contrastive denoising queries whose structure never depends on the data.

mmdet's ``CdnQueryGenerator`` sizes the denoising (dn) part from the GT of
the local batch. A rank whose batch has no GT gets zero dn queries, so the
modules, loss terms and gradients on that rank are shaped differently from
its peers. :class:`DDPSafeCdnQueryGenerator` builds one masked dummy group
instead, which every downstream module treats like a real group and the
DDP-safe DINO head weights by exactly zero.
"""
from typing import Dict, Tuple

import torch
from mmdet.models.layers import CdnQueryGenerator
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from torch import Tensor

#: Key added to ``dn_meta``: True when the dn part is the dummy group built
#: for a batch without GT, whose loss terms must be weighted by zero.
DUMMY_DN_GROUP_KEY = 'dummy_dn_group'

# The dummy group has one target slot: a positive and a negative query.
DUMMY_NUM_TARGETS = 1
DUMMY_NUM_GROUPS = 1


@MODELS.register_module()
class DDPSafeCdnQueryGenerator(CdnQueryGenerator):
    """``CdnQueryGenerator`` that returns one dummy group for a batch
    without GT.

    Differs from ``CdnQueryGenerator.__call__`` only when no sample of the
    local batch has a GT box. Upstream then returns an empty dn part
    (``num_denoising_queries=0``); whether ``label_embedding`` still reaches
    the loss is left to chance, and ports that drop the empty dn part lose
    its loss keys and hang DDP. Here the batch gets one dummy group instead:

    - one target slot (a positive and a negative query per image), so
      ``num_denoising_queries=2`` and ``num_denoising_groups=1``;
    - label queries ``label_embedding(0)``, so the embedding stays in the
      graph and receives a (zero-valued) gradient on this rank as well;
    - box queries ``inverse_sigmoid(0.5) = 0``, i.e. reference boxes
      ``(0.5, 0.5, 0.5, 0.5)``: finite, non-degenerate, the same as
      upstream's padding queries;
    - the upstream attention mask for one group of one target, so matching
      queries cannot see the dummy;
    - ``dn_meta['dummy_dn_group'] = True``, which tells
      ``DDPSafeDINOHead`` to give every dummy query zero weight in the
      classification, box and IoU terms.

    The dummy consumes no random numbers. When the batch has any GT box,
    ``super().__call__`` runs unchanged (same arithmetic, same RNG draws)
    and ``dn_meta`` only gains ``dummy_dn_group=False``.

    Args:
        num_classes (int): Number of object classes.
        embed_dims (int): Embedding dimensions of the generated queries.
        num_matching_queries (int): Number of matching queries; sizes the
            attention mask.
        label_noise_scale (float): Scale of the label noise. Defaults to
            0.5.
        box_noise_scale (float): Scale of the box noise. Defaults to 1.0.
        group_cfg (dict, optional): Grouping of the dn queries, with keys
            ``dynamic``, ``num_dn_queries`` and ``num_groups``, as in
            ``CdnQueryGenerator``. Defaults to None.
    """

    def __call__(self, batch_data_samples: SampleList) -> Tuple:
        """Generate the dn queries, attention mask and ``dn_meta``.

        Args:
            batch_data_samples (list[:obj:`DetDataSample`]): Samples of the
                local batch, with ``gt_instances.bboxes`` in unnormalized
                (x1, y1, x2, y2) and ``gt_instances.labels``.

        Returns:
            tuple: ``(dn_label_query, dn_bbox_query, attn_mask, dn_meta)``
            as ``CdnQueryGenerator.__call__`` returns them, ``dn_meta``
            extended by ``dummy_dn_group`` (bool).
        """
        num_targets = sum(
            len(sample.gt_instances.bboxes) for sample in batch_data_samples)
        if num_targets == 0:
            return self.generate_dummy_group(len(batch_data_samples))
        *queries_and_mask, dn_meta = super().__call__(batch_data_samples)
        dn_meta[DUMMY_DN_GROUP_KEY] = False
        return (*queries_and_mask, dn_meta)

    def generate_dummy_group(
            self, batch_size: int) -> Tuple[Tensor, Tensor, Tensor, Dict]:
        """Build the dummy dn group for a batch without GT.

        Args:
            batch_size (int): Number of images in the local batch.

        Returns:
            tuple: ``dn_label_query`` (batch_size, 2, embed_dims),
            ``dn_bbox_query`` (batch_size, 2, 4), ``attn_mask``
            (2 + num_matching_queries, 2 + num_matching_queries) and
            ``dn_meta`` with ``dummy_dn_group=True``.
        """
        device = self.label_embedding.weight.device
        num_queries = 2 * DUMMY_NUM_TARGETS * DUMMY_NUM_GROUPS
        dummy_labels = torch.zeros(
            batch_size, num_queries, dtype=torch.long, device=device)
        dn_label_query = self.label_embedding(dummy_labels)
        dn_bbox_query = torch.zeros(batch_size, num_queries, 4, device=device)
        attn_mask = self.generate_dn_mask(
            DUMMY_NUM_TARGETS, DUMMY_NUM_GROUPS, device=device)
        dn_meta = {
            'num_denoising_queries': num_queries,
            'num_denoising_groups': DUMMY_NUM_GROUPS,
            DUMMY_DN_GROUP_KEY: True,
        }
        return dn_label_query, dn_bbox_query, attn_mask, dn_meta
