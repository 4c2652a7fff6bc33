"""DDP-safe denoising queries generated as upstream RT-DETR does."""
from typing import Tuple

import torch
from mmdet.models.layers.transformer import inverse_sigmoid
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from torch import Tensor, nn

from mmddp_ext.models.layers import (DUMMY_DN_GROUP_KEY,
                                     DDPSafeCdnQueryGenerator)
from .host_to_device import host_to_device

# upstream's inverse_sigmoid eps (mmdet's CdnQueryGenerator uses 1e-3)
INVERSE_SIGMOID_EPS = 1e-5


@MODELS.register_module()
class RTDETRCdnQueryGenerator(DDPSafeCdnQueryGenerator):
    """:class:`DDPSafeCdnQueryGenerator` with upstream RT-DETR's class
    embedding and noise (``get_contrastive_denoising_training_group``).

    Differs from ``CdnQueryGenerator`` in:

    - ``__init__``: ``label_embedding`` is ``nn.Embedding(num_classes + 1,
      embed_dims, padding_idx=num_classes)`` like upstream's
      ``denoising_class_embed``, so converted checkpoints map 1:1;
    - ``__call__`` with GT in the batch (replaced): the GT of each image is
      padded to the batch maximum first, with class ``num_classes`` (the
      zero padding row) and box ``(0, 0, 0, 0)``, and tiled over the
      groups; the label noise then draws its random numbers over *all*
      these queries (padding included, masked afterwards) and the box
      noise likewise, in upstream's order (``rand``, ``randint`` for the
      labels; ``randint``, ``rand`` for the boxes), so the same seed gives
      upstream's noisy queries; boxes go back to logits with upstream's
      eps 1e-5. mmdet draws over the real GT only, pads the logits with
      0 (box (0.5, 0.5, 0.5, 0.5)) and uses eps 1e-3.

    The attention mask, ``dn_meta`` layout and the group count are the
    same in both. A batch without GT still gets the DDP-safe dummy group of
    :class:`DDPSafeCdnQueryGenerator` (upstream returns nothing there).

    Accepts the config keys of :class:`DDPSafeCdnQueryGenerator`;
    ``label_noise_scale`` is upstream's ``label_noise_ratio``.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.label_embedding = nn.Embedding(
            self.num_classes + 1,
            self.embed_dims,
            padding_idx=self.num_classes)

    def __call__(self, batch_data_samples: SampleList) -> Tuple:
        """Generate the dn queries, attention mask and ``dn_meta``.

        Args:
            batch_data_samples (list[:obj:`DetDataSample`]): Samples of the
                local batch, with ``gt_instances.bboxes`` in unnormalized
                (x1, y1, x2, y2), ``gt_instances.labels`` and
                ``img_shape``.

        Returns:
            tuple: ``dn_label_query`` (bs, num_dn, embed_dims),
            ``dn_bbox_query`` (bs, num_dn, 4) box logits, ``attn_mask``
            (num_dn + num_matching_queries, same) and ``dn_meta`` with
            ``num_denoising_queries``, ``num_denoising_groups`` and
            ``dummy_dn_group``.
        """
        if not any(len(s.gt_instances.bboxes) for s in batch_data_samples):
            return self.generate_dummy_group(len(batch_data_samples))
        labels, boxes, is_gt = self._padded_targets(batch_data_samples)
        max_gt = labels.size(1)
        num_groups = self.get_num_groups(max_gt)
        labels = labels.tile([1, 2 * num_groups])
        boxes = boxes.tile([1, 2 * num_groups, 1])
        is_gt = is_gt.tile([1, 2 * num_groups])
        # each group: max_gt positive queries, then max_gt negative ones
        negative = boxes.new_zeros(boxes.size(0), 2 * max_gt, 1)
        negative[:, max_gt:] = 1
        negative = negative.tile([1, num_groups, 1])
        if self.label_noise_scale > 0:
            flip = torch.rand_like(
                labels, dtype=torch.float) < self.label_noise_scale * 0.5
            noisy = torch.randint_like(flip, 0, self.num_classes,
                                       dtype=labels.dtype)
            labels = torch.where(flip & is_gt, noisy, labels)
        if self.box_noise_scale > 0:
            corners = bbox_cxcywh_to_xyxy(boxes)
            half_size = (boxes[..., 2:] * 0.5).tile([1, 1, 2])
            sign = torch.randint_like(boxes, 0, 2) * 2.0 - 1.0
            part = torch.rand_like(boxes)
            part = (part + 1.0) * negative + part * (1 - negative)
            corners = corners + sign * part * half_size * self.box_noise_scale
            boxes = bbox_xyxy_to_cxcywh(corners.clamp(min=0.0, max=1.0))
        num_queries = 2 * max_gt * num_groups
        dn_meta = {
            'num_denoising_queries': num_queries,
            'num_denoising_groups': num_groups,
            DUMMY_DN_GROUP_KEY: False,
        }
        return (self.label_embedding(labels),
                inverse_sigmoid(boxes, eps=INVERSE_SIGMOID_EPS),
                self.generate_dn_mask(
                    max_gt, num_groups, device=labels.device), dn_meta)

    def _padded_targets(self, batch_data_samples: SampleList
                        ) -> Tuple[Tensor, Tensor, Tensor]:
        """Per-image GT padded to the batch maximum: labels (bs, max_gt)
        padded with ``num_classes``, normalized (cx, cy, w, h) boxes
        (bs, max_gt, 4) padded with 0, and the GT mask (bs, max_gt)."""
        device = self.label_embedding.weight.device
        max_gt = max(len(s.gt_instances.bboxes) for s in batch_data_samples)
        batch_size = len(batch_data_samples)
        # int32 as upstream: randint_like draws in the labels' dtype
        labels = torch.full((batch_size, max_gt),
                            self.num_classes,
                            dtype=torch.int32,
                            device=device)
        boxes = torch.zeros(batch_size, max_gt, 4, device=device)
        is_gt = torch.zeros(batch_size, max_gt, dtype=torch.bool,
                            device=device)
        # one non-blocking copy of the image sizes (a new_tensor per image
        # would make the host wait for the backbone each time)
        factors = host_to_device(
            [[width, height, width, height]
             for height, width in (s.img_shape for s in batch_data_samples)],
            device, boxes.dtype)
        for i, sample in enumerate(batch_data_samples):
            count = len(sample.gt_instances.bboxes)
            labels[i, :count] = sample.gt_instances.labels
            boxes[i, :count] = bbox_xyxy_to_cxcywh(
                sample.gt_instances.bboxes.to(boxes) / factors[i])
            is_gt[i, :count] = True
        return labels, boxes, is_gt
