"""Upstream's detection post-processing of the real-time DETRs in deploy
mode, as a function of tensors.

RT-DETR (``RTDETRPostProcessor``), D-FINE (``DFINEPostProcessor``), DEIM
and DEIMv2 (``PostProcessor``) ship the same module; with
``use_focal_loss=True`` (every config of the four) and ``deploy_mode``
set by its ``deploy()``, it returns ``(labels, boxes, scores)`` for the
last decoder layer's outputs:

- scores: the sigmoid of every (query, class) logit, flattened per image
  to ``num_queries * num_classes`` entries, and the ``num_top_queries``
  largest of them, in decreasing order (``torch.topk``);
- labels: the flat index modulo ``num_classes`` (computed as
  ``i - i // C * C``: upstream's ``mod``, for TensorRT versions without an
  integer modulo);
- boxes: the query ``i // C``'s normalised (cx, cy, w, h) box as
  (x1, y1, x2, y2), times ``[w, h, w, h]`` of ``orig_target_sizes``: in
  the pixels of the original image. Not clamped to the image.

The detectors' own ``predict`` path here computes the same top-k
(``RTDETRHead._predict_by_feat_single``) and maps the boxes back to the
original image through ``img_shape`` and ``scale_factor``.
"""
from typing import Tuple

from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from torch import Tensor


def rtdetr_postprocess(logits: Tensor, boxes: Tensor,
                       orig_target_sizes: Tensor,
                       num_top_queries: int) -> Tuple[Tensor, Tensor, Tensor]:
    """Upstream's deploy-mode post-processing (see the module doc).

    Args:
        logits (Tensor): Class logits of the last decoder layer run,
            (N, num_queries, num_classes).
        boxes (Tensor): Its normalised (cx, cy, w, h) boxes,
            (N, num_queries, 4).
        orig_target_sizes (Tensor): (N, 2) int64, each image's original
            ``[width, height]``.
        num_top_queries (int): K, the detections kept per image.

    Returns:
        tuple[Tensor]: ``labels`` (N, K) int64, ``boxes`` (N, K, 4)
        (x1, y1, x2, y2) in original pixels, ``scores`` (N, K), each
        image's detections in decreasing score order.
    """
    num_classes = logits.shape[-1]
    scores, index = logits.sigmoid().flatten(1).topk(num_top_queries, dim=-1)
    labels = index - index // num_classes * num_classes
    query = index // num_classes
    scale = orig_target_sizes.to(boxes.dtype).repeat(1, 2).unsqueeze(1)
    corners = bbox_cxcywh_to_xyxy(boxes) * scale
    picked = corners.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
    return labels, picked, scores
