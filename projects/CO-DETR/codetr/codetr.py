"""The CO-DETR detector: a DETR query head trained together with
auxiliary one-stage (ATSS) and two-stage (RPN + RoI) heads."""
import copy
import logging
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from mmdet.models.detectors.base import BaseDetector
from mmdet.registry import MODELS
from mmdet.structures import OptSampleList, SampleList
from mmdet.utils import InstanceList, OptConfigType, OptMultiConfig
from mmengine.logging import print_log
from torch import Tensor

from mmddp_ext.utils import full_precision

EVAL_MODULES = ('detr', 'one-stage', 'two-stage')


def _with_index(losses: Dict, index: int) -> Dict:
    """Suffix every key with the head index, as upstream names them."""
    return {f'{key}{index}': value for key, value in losses.items()}


@MODELS.register_module()
class CoDETR(BaseDetector):
    """CO-DETR (Zong et al., ICCV 2023), the DDP-safe port.

    Module names are upstream's (``backbone``, ``neck``, ``query_head``,
    ``rpn_head``, ``roi_head.N``, ``bbox_head.N``) so upstream checkpoints
    load with no missing or unexpected keys. Training: the query head runs
    first and hands its encoder output (as feature maps) to the RPN, the
    RoI heads and the one-stage heads; each auxiliary head's positive
    assignments then become an extra query group of the query head. Every
    head runs on every rank whatever its GT, so the loss keys, the
    modules in the graph and the collectives are the same everywhere.

    Args:
        backbone (dict): Backbone config.
        neck (dict, optional): Neck config. Defaults to None.
        query_head (dict, optional): ``CoDINOHead`` config. Defaults to
            None.
        rpn_head (dict, optional): RPN config. Defaults to None.
        roi_head (list[dict]): Two-stage auxiliary heads. Defaults to [].
        bbox_head (list[dict]): One-stage auxiliary heads. Defaults to [].
        train_cfg (list[dict], optional): Per head, in the order query
            head, RPN+RoI heads (one entry with ``rpn``, ``rpn_proposal``,
            ``rcnn``), one-stage heads. Defaults to None.
        test_cfg (list[dict], optional): Same order. Defaults to None.
        with_pos_coord (bool): Train the auxiliary positive query groups.
            Defaults to True.
        use_lsj (bool): Treat the whole padded batch as image: before the
            heads run, each sample's ``img_shape`` becomes its
            ``batch_input_shape`` (no padding mask, boxes normalised by the
            padded size). Meant for large-scale jitter, where the pipeline
            pads every image to one fixed size. Defaults to False: a
            config that does not name the key keeps its batch padding
            masked, as upstream trains non-LSJ configs. How it differs
            from upstream: upstream's default is True, but its code writes
            ``img_shape`` into a copy of ``metainfo``, so the key does
            nothing there; its LSJ configs get the same effect from
            mmdet's ``Pad`` transform, which sets ``img_shape`` to the
            padded size. On upstream's configs (LSJ: ``use_lsj=True`` and
            ``Pad`` to the batch size; the rest: ``use_lsj=False``) the two
            agree. They differ only when ``use_lsj=True`` and a batch is
            padded past ``img_shape``: the port trains on the padding as
            image (and logs a warning once), upstream masks it.
        eval_module (str): Head used for prediction: 'detr', 'one-stage'
            or 'two-stage'. Defaults to 'detr'.
        eval_index (int): Which auxiliary head predicts for 'one-stage' or
            'two-stage'. Defaults to 0.
        data_preprocessor (dict, optional): Data preprocessor config.
            Defaults to None.
        init_cfg (dict, optional): Initialisation config. Defaults to None.
    """

    def __init__(self,
                 backbone: dict,
                 neck: OptConfigType = None,
                 query_head: OptConfigType = None,
                 rpn_head: OptConfigType = None,
                 roi_head: Sequence[Optional[dict]] = (),
                 bbox_head: Sequence[Optional[dict]] = (),
                 train_cfg: Optional[Sequence[Optional[dict]]] = None,
                 test_cfg: Optional[Sequence[Optional[dict]]] = None,
                 with_pos_coord: bool = True,
                 use_lsj: bool = False,
                 eval_module: str = 'detr',
                 eval_index: int = 0,
                 data_preprocessor: OptConfigType = None,
                 init_cfg: OptMultiConfig = None) -> None:
        super().__init__(
            data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if eval_module not in EVAL_MODULES:
            raise ValueError(
                f'CoDETR: model.eval_module must be one of {EVAL_MODULES}, '
                f"but got {eval_module!r}. Use 'detr' for the query head.")
        self.with_pos_coord = with_pos_coord
        self.use_lsj = use_lsj
        self._lsj_padding_logged = False
        self.eval_module = eval_module
        self.eval_index = eval_index
        roi_heads = [cfg for cfg in roi_head if cfg]
        bbox_heads = [cfg for cfg in bbox_head if cfg]
        num_cfgs = int(
            query_head is not None) + len(roi_heads) + len(bbox_heads) + int(
                rpn_head is not None and not roi_heads)
        train_cfg = list(train_cfg or [None] * num_cfgs)
        test_cfg = list(test_cfg or [None] * num_cfgs)
        self.train_cfg, self.test_cfg = train_cfg, test_cfg

        self.backbone = MODELS.build(backbone)
        if neck is not None:
            self.neck = MODELS.build(neck)
        head_idx = 0
        if query_head is not None:
            self.query_head = MODELS.build(
                dict(query_head, train_cfg=train_cfg[0], test_cfg=test_cfg[0]))
            head_idx = 1
        self.head_idx = head_idx
        if rpn_head is not None:
            self.rpn_head = MODELS.build(
                dict(
                    rpn_head,
                    train_cfg=_part(train_cfg[head_idx], 'rpn'),
                    test_cfg=_part(test_cfg[head_idx], 'rpn')))
        self.roi_head = nn.ModuleList([
            MODELS.build(
                dict(
                    cfg,
                    train_cfg=_part(train_cfg[head_idx + i], 'rcnn'),
                    test_cfg=_part(test_cfg[head_idx + i], 'rcnn')))
            for i, cfg in enumerate(roi_heads)
        ])
        first = head_idx + len(self.roi_head)
        self.bbox_head = nn.ModuleList([
            MODELS.build(
                dict(
                    cfg,
                    train_cfg=train_cfg[first + i],
                    test_cfg=test_cfg[first + i]))
            for i, cfg in enumerate(bbox_heads)
        ])

    @property
    def with_rpn(self) -> bool:
        """bool: whether the detector has an RPN."""
        return getattr(self, 'rpn_head', None) is not None

    @property
    def with_query_head(self) -> bool:
        """bool: whether the detector has a query head."""
        return getattr(self, 'query_head', None) is not None

    def extract_feat(self, batch_inputs: Tensor) -> Tuple[Tensor]:
        """Backbone (+ neck) features."""
        x = self.backbone(batch_inputs)
        return self.neck(x) if self.with_neck else x

    def _lsj_img_shape(self, batch_data_samples: SampleList) -> None:
        """With ``use_lsj``, the padded batch is the image (see the class
        docstring for how this differs from upstream)."""
        if not self.use_lsj:
            return
        for sample in batch_data_samples:
            img_shape = tuple(sample.metainfo['img_shape'])
            batch_shape = tuple(sample.metainfo['batch_input_shape'])
            if img_shape != batch_shape and not self._lsj_padding_logged:
                self._lsj_padding_logged = True
                print_log(
                    f'CoDETR: use_lsj=True trains on batch padding as image '
                    f'(img_shape {img_shape} -> batch_input_shape '
                    f'{batch_shape}); upstream masks this padding. Set '
                    'model.use_lsj=False unless the pipeline pads every '
                    'image to the batch size (LSJ Pad).',
                    logger='current',
                    level=logging.WARNING)
            sample.set_metainfo(dict(img_shape=batch_shape))

    def loss(self, batch_inputs: Tensor,
             batch_data_samples: SampleList) -> Union[dict, list]:
        """Losses of the query head, the auxiliary heads and the query
        head's auxiliary positive query groups (keys as upstream)."""
        self._lsj_img_shape(batch_data_samples)
        x = self.extract_feat(batch_inputs)
        losses = dict()
        if self.with_query_head:
            query_losses, x = self.query_head.loss(x, batch_data_samples)
            losses.update(query_losses)

        if self.with_rpn:
            cfg = self.train_cfg[self.head_idx]
            proposal_cfg = cfg.get('rpn_proposal',
                                   _part(self.test_cfg[self.head_idx], 'rpn'))
            rpn_samples = copy.deepcopy(batch_data_samples)
            for sample in rpn_samples:
                sample.gt_instances.labels = torch.zeros_like(
                    sample.gt_instances.labels)
            # The RPN runs in float32 under autocast (an AMP recipe):
            # mmcv's NMS takes float32 scores only on the CPU ("expected
            # scalar type Float but found Half"), and the proposals become
            # the RoI head's boxes and the query head's positive queries.
            # MMDetection 2.x (upstream CO-DETR) decoded them in float32 too
            # (force_fp32); here its three convolutions per level are
            # float32 as well.
            with torch.autocast(x[0].device.type, enabled=False):
                rpn_losses, proposals = self.rpn_head.loss_and_predict(
                    tuple(full_precision(feat) for feat in x),
                    rpn_samples,
                    proposal_cfg=proposal_cfg)
            losses.update({
                (f'rpn_{key}' if 'loss' in key and 'rpn' not in key else key):
                value
                for key, value in rpn_losses.items()
            })
        elif self.roi_head:
            proposals = [sample.proposals for sample in batch_data_samples]

        positive_coords = []
        aux_heads = list(self.roi_head) + list(self.bbox_head)
        for index, head in enumerate(aux_heads):
            if index < len(self.roi_head):
                head_losses = head.loss(x, proposals, batch_data_samples)
            else:
                head_losses = head.loss(x, batch_data_samples)
            pos_coords = head_losses.pop('pos_coords', None)
            if self.with_pos_coord:
                positive_coords.append(pos_coords)
            losses.update(_with_index(head_losses, index))

        for index, pos_coords in enumerate(positive_coords):
            aux_losses = self.query_head.loss_aux(x, pos_coords, index,
                                                  batch_data_samples)
            losses.update(_with_index(aux_losses, index))
        return losses

    def predict(self,
                batch_inputs: Tensor,
                batch_data_samples: SampleList,
                rescale: bool = True) -> SampleList:
        """Detections of the head chosen by ``eval_module``."""
        self._lsj_img_shape(batch_data_samples)
        feats = self.extract_feat(batch_inputs)
        if self.eval_module == 'detr' or not (self.roi_head or self.bbox_head):
            results = self.query_head.predict(
                feats, batch_data_samples, rescale=rescale)
        else:
            results = self._predict_aux(feats, batch_data_samples, rescale)
        return self.add_pred_to_datasample(batch_data_samples, results)

    def _predict_aux(self, feats: Tuple[Tensor],
                     batch_data_samples: SampleList,
                     rescale: bool) -> InstanceList:
        """Detections of auxiliary head ``eval_index`` on the encoder
        output."""
        if self.with_query_head:
            metas = [sample.metainfo for sample in batch_data_samples]
            feats = self.query_head(feats, metas)[-1]
        if self.eval_module == 'one-stage':
            return self.bbox_head[self.eval_index].predict(
                feats, batch_data_samples, rescale=rescale)
        proposals = self.rpn_head.predict(
            feats, batch_data_samples, rescale=False)
        return self.roi_head[self.eval_index].predict(
            feats, proposals, batch_data_samples, rescale=rescale)

    def _forward(self,
                 batch_inputs: Tensor,
                 batch_data_samples: OptSampleList = None) -> List[Tensor]:
        """Raw query-head outputs (class scores and boxes per layer)."""
        feats = self.extract_feat(batch_inputs)
        metas = [sample.metainfo for sample in batch_data_samples]
        return self.query_head(feats, metas)[:2]


def _part(cfg: Optional[dict], key: str) -> Optional[dict]:
    """``cfg[key]`` or None."""
    return None if cfg is None else cfg.get(key)
