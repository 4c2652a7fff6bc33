"""Faster R-CNN RoI head that also reports its sampled proposals."""
from typing import List, Tuple

import torch
from mmdet.models.roi_heads import StandardRoIHead
from mmdet.models.task_modules.samplers import SamplingResult
from mmdet.models.utils import unpack_gt_instances
from mmdet.registry import MODELS
from mmdet.structures import SampleList
from mmdet.utils import InstanceList
from torch import Tensor

from mmddp_ext.utils import full_precision

# Upstream caps the proposals handed to the query head per image.
MAX_PROPOSALS = 2000


@MODELS.register_module()
class CoStandardRoIHead(StandardRoIHead):
    """``StandardRoIHead`` whose loss dict also carries ``pos_coords``:
    per image, the sampled proposals with their labels, box targets and
    mean RoI features, from which the CO-DINO query head builds its extra
    positive queries. Accepts the config keys of ``StandardRoIHead``.
    """

    def loss(self, x: Tuple[Tensor], rpn_results_list: InstanceList,
             batch_data_samples: SampleList) -> dict:
        """Assign, sample, bbox loss, and ``pos_coords``.

        Replaces ``StandardRoIHead.loss`` (bbox branch only, as upstream
        CO-DETR): the sampling results, which upstream's method keeps
        local, are needed for ``pos_coords``.

        Returns:
            dict: ``loss_cls``, ``loss_bbox``, ``acc`` and ``pos_coords`` =
            (proposals (bs, n, 4), labels (bs, n), targets (bs, n, 4),
            features (bs, n, C), 'rcnn') with ``n`` the smallest sample
            count of the batch.
        """
        if not self.with_bbox or self.with_mask:
            raise ValueError(
                'CoStandardRoIHead: CO-DETR uses a bbox-only RoI head, so '
                'roi_head needs bbox_roi_extractor/bbox_head and no '
                'mask_head, but got with_bbox='
                f'{self.with_bbox}, with_mask={self.with_mask}. Remove '
                'mask_roi_extractor/mask_head.')
        batch_gt_instances, batch_gt_instances_ignore, _ = \
            unpack_gt_instances(batch_data_samples)
        sampling_results = []
        for index, rpn_results in enumerate(rpn_results_list):
            rpn_results.priors = rpn_results.pop('bboxes')
            assign_result = self.bbox_assigner.assign(
                rpn_results, batch_gt_instances[index],
                batch_gt_instances_ignore[index])
            sampling_results.append(
                self.bbox_sampler.sample(
                    assign_result,
                    rpn_results,
                    batch_gt_instances[index],
                    feats=[feat[index][None] for feat in x]))
        bbox_results = self.bbox_loss(x, sampling_results)
        losses = dict(bbox_results['loss_bbox'])
        losses['pos_coords'] = self._pos_coords(sampling_results, bbox_results)
        return losses

    def bbox_loss(self, x: Tuple[Tensor],
                  sampling_results: List[SamplingResult]) -> dict:
        """``StandardRoIHead.bbox_loss`` plus ``bbox_targets`` (labels,
        label weights, box targets, box weights of every sampled RoI)."""
        bbox_results = super().bbox_loss(x, sampling_results)
        bbox_results['bbox_targets'] = self.bbox_head.get_targets(
            sampling_results, self.train_cfg, concat=True)
        return bbox_results

    def _bbox_forward(self, x: Tuple[Tensor], rois: Tensor) -> dict:
        """``StandardRoIHead._bbox_forward`` on float32 features.

        Under autocast (an AMP recipe) the features arrive in float16, and
        mmcv's RoIAlign samples and sums them in the dtype it is given (on
        the CPU also about 20 times slower than in float32: 0.8 s of a 3 s
        CO-DINO-tiny step). Upstream CO-DETR (MMDetection 2.x) ran the RoI
        extractor in float32 under fp16 training (``force_fp32``); the box
        head's layers still run in the autocast dtype."""
        return super()._bbox_forward(
            tuple(full_precision(feat) for feat in x), rois)

    @staticmethod
    def _pos_coords(sampling_results: List[SamplingResult],
                    bbox_results: dict) -> tuple:
        """The first ``n`` sampled RoIs of each image (positives first)."""
        count = min([MAX_PROPOSALS] +
                    [len(res.priors) for res in sampling_results])
        labels, _, targets, _ = bbox_results['bbox_targets']
        feats = bbox_results['bbox_feats'].mean((-2, -1))
        boxes, out_labels, out_targets, out_feats = [], [], [], []
        start = 0
        for res in sampling_results:
            rows = slice(start, start + count)
            boxes.append(res.priors[:count])
            out_labels.append(labels[rows])
            out_targets.append(targets[rows])
            out_feats.append(feats[rows])
            start += len(res.priors)
        return (torch.stack(boxes), torch.stack(out_labels),
                torch.stack(out_targets), torch.stack(out_feats), 'rcnn')
