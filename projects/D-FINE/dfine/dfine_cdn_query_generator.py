"""DDP-safe denoising queries generated as upstream D-FINE does."""
from typing import Tuple

import torch
from mmdet.models.layers.transformer import inverse_sigmoid
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy, bbox_xyxy_to_cxcywh
from torch import Tensor

from mmddp_ext.models.layers import DUMMY_DN_GROUP_KEY
from .ports import RTDETRCdnQueryGenerator

# upstream's inverse_sigmoid eps
INVERSE_SIGMOID_EPS = 1e-5


@MODELS.register_module()
class DFINECdnQueryGenerator(RTDETRCdnQueryGenerator):
    """:class:`RTDETRCdnQueryGenerator` with D-FINE's one change to the
    noisy boxes (upstream ``src/zoo/dfine/denoising.py``).

    Differs from ``RTDETRCdnQueryGenerator.__call__`` (replaced) only in
    the box noise: after the noisy corners are clipped to the image, a box
    whose corners crossed has a negative width or height, and D-FINE
    takes its absolute value before the inverse sigmoid (RT-DETR's
    inverse sigmoid clips it to 0, a box logit of -11.5). Padding, label
    noise, the random draws and their order, the attention mask and
    ``dn_meta`` are the same; a batch without GT still gets the DDP-safe
    dummy group (upstream D-FINE gives it no dn query, ``dn_num_group:
    0``).

    Accepts the config keys of :class:`RTDETRCdnQueryGenerator`.
    """

    def __call__(self, batch_data_samples: SampleList) -> Tuple:
        """Generate the dn queries, attention mask and ``dn_meta``, as
        ``RTDETRCdnQueryGenerator.__call__`` documents."""
        if not any(len(s.gt_instances.bboxes) for s in batch_data_samples):
            return self.generate_dummy_group(len(batch_data_samples))
        labels, boxes, is_gt = self._padded_targets(batch_data_samples)
        max_gt = labels.size(1)
        num_groups = self.get_num_groups(max_gt)
        repeats = 2 * num_groups
        labels = self._noisy_labels(
            labels.tile([1, repeats]), is_gt.tile([1, repeats]))
        boxes = self._noisy_boxes(
            boxes.tile([1, repeats, 1]), max_gt, num_groups)
        dn_meta = {
            'num_denoising_queries': repeats * max_gt,
            'num_denoising_groups': num_groups,
            DUMMY_DN_GROUP_KEY: False,
        }
        return (self.label_embedding(labels),
                inverse_sigmoid(boxes, eps=INVERSE_SIGMOID_EPS),
                self.generate_dn_mask(
                    max_gt, num_groups, device=labels.device), dn_meta)

    def _noisy_labels(self, labels: Tensor, is_gt: Tensor) -> Tensor:
        """Each GT label replaced by a random class with probability
        ``label_noise_scale / 2`` (draws over all queries, padding
        included)."""
        if self.label_noise_scale <= 0:
            return labels
        flip = torch.rand_like(
            labels, dtype=torch.float) < self.label_noise_scale * 0.5
        noisy = torch.randint_like(
            flip, 0, self.num_classes, dtype=labels.dtype)
        return torch.where(flip & is_gt, noisy, labels)

    def _noisy_boxes(self, boxes: Tensor, max_gt: int,
                     num_groups: int) -> Tensor:
        """Corners moved by up to half the box size (positives) or between
        half and the whole size (negatives), clipped to [0, 1]; sizes made
        non-negative."""
        if self.box_noise_scale <= 0:
            return boxes
        negative = boxes.new_zeros(boxes.size(0), 2 * max_gt, 1)
        negative[:, max_gt:] = 1
        negative = negative.tile([1, num_groups, 1])
        half_size = (boxes[..., 2:] * 0.5).tile([1, 1, 2])
        sign = torch.randint_like(boxes, 0, 2) * 2.0 - 1.0
        part = torch.rand_like(boxes)
        part = (part + 1.0) * negative + part * (1 - negative)
        corners = bbox_cxcywh_to_xyxy(boxes) + (
            sign * part * half_size * self.box_noise_scale)
        return bbox_xyxy_to_cxcywh(corners.clamp(min=0.0, max=1.0)).abs()
