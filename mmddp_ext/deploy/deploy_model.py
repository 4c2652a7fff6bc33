"""The deploy model of the real-time DETRs: upstream's
``model.deploy()`` followed by ``postprocessor.deploy()``, on an
MMDetection detector."""
from typing import Tuple

from torch import Tensor, nn

from .rtdetr_postprocess import rtdetr_postprocess

# The families whose detectors derive from the RT-DETR port's RTDETR and
# whose heads keep its post-processing.
SUPPORTED_FAMILIES = ('RT-DETR (v1, v2: projects/RT-DETR), D-FINE '
                      '(projects/D-FINE), DEIM (its D-FINE and RT-DETRv2 '
                      'models: projects/DEIM) and DEIMv2 (projects/DEIMv2)')
BASE_DETECTOR = 'RTDETR'
BASE_HEAD = 'RTDETRHead'


def check_deployable_type(detector_type: type) -> None:
    """Refuse a detector class outside the real-time DETR families.

    The deploy model runs the detector's mmdet ``_forward`` without data
    samples (backbone, neck, ``forward_transformer``, head ``forward``),
    which the RT-DETR port and the ports derived from it support: no
    padding masks, a decoder that stops at ``eval_idx`` in eval mode. The
    class is looked up in mmdet's ``MODELS`` by name, so that mmddp_ext
    imports no project; the config's ``custom_imports`` register it.

    Raises:
        ValueError: ``detector_type`` does not derive from the registered
            ``RTDETR`` (or none is registered). The message names the
            type and the supported families.
    """
    from mmdet.registry import MODELS
    base = MODELS.get(BASE_DETECTOR)
    if base is not None and issubclass(detector_type, base):
        return
    why = ('' if base is not None else
           f' ({BASE_DETECTOR} is not registered: a config of these '
           "families imports it through custom_imports, e.g. "
           "'projects.RT-DETR.rtdetr')")
    raise ValueError(
        f'model.type={detector_type.__name__!r} cannot be exported with '
        "upstream's deploy contract (images, orig_target_sizes) -> "
        '(labels, boxes, scores): it supports the real-time DETRs, whose '
        f'detectors derive from {BASE_DETECTOR}: {SUPPORTED_FAMILIES}'
        f'{why}. Export one of their configs (*_coco.py, *_custom.py); '
        'other detectors need their own post-processing (e.g. NMS) and '
        'are not supported.')


def check_deployable_head(head: nn.Module) -> None:
    """Refuse a head whose predictions are not upstream's post-processing
    of its outputs, so that the deploy model's outputs are what the
    detector's own ``predict`` returns.

    Raises:
        ValueError: The head overrides ``RTDETRHead``'s
            ``_predict_by_feat_single`` (another top-k or box mapping), or
            scores classes with a softmax (``cls_out_channels`` is not
            ``num_classes``).
    """
    from mmdet.registry import MODELS
    reference = MODELS.get(BASE_HEAD)._predict_by_feat_single
    name = type(head).__name__
    if getattr(type(head), '_predict_by_feat_single', None) is not reference:
        raise ValueError(
            f'bbox_head type {name!r} post-processes its outputs with its '
            f"own _predict_by_feat_single, not {BASE_HEAD}'s (upstream's "
            'top-k of the sigmoid scores, boxes scaled to the original '
            'image): the exported model would not return what the '
            "detector's predict returns. Keep RTDETRHead's method in the "
            'head, or export a head of the supported families '
            f'({SUPPORTED_FAMILIES}).')
    if getattr(head, 'cls_out_channels', None) != head.num_classes:
        raise ValueError(
            f'bbox_head type {name!r} has cls_out_channels='
            f'{getattr(head, "cls_out_channels", None)} for num_classes='
            f'{head.num_classes}: a softmax classifier. Upstream\'s deploy '
            'post-processing is the sigmoid (use_focal_loss=True) one; '
            'set bbox_head.loss_cls to a sigmoid loss (use_sigmoid=True).')


class DeployModel(nn.Module):
    """Upstream's exported model: ``model.deploy()`` then
    ``postprocessor.deploy()`` (``tools/deployment/export_onnx.py`` of
    RT-DETR, D-FINE, DEIM and DEIMv2), on the mmdet port.

    ``forward(images, orig_target_sizes) -> (labels, boxes, scores)``:

    - the detector's mmdet forward in ``'tensor'`` mode (backbone, neck,
      ``forward_transformer``, head ``forward``), in eval mode, where the
      decoder stops at ``eval_idx`` (upstream's ``deploy()`` drops the
      heads after it; the outputs are the same), and the conv + BatchNorm
      pairs of the ports run folded (upstream's ``convert_to_deploy``);
    - the last layer run's logits and boxes through :meth:`postprocess`
      (:func:`rtdetr_postprocess`), upstream's ``RTDETRPostProcessor``.

    Inputs: ``images`` (N, 3, H, W) float32, RGB in [0, 1] resized to
    H x W, normalised as the config's ``data_preprocessor`` does (its
    ``mean`` and ``std`` divided by 255: none for upstream's HGNetv2 and
    ResNet configs, ImageNet's for DEIMv2's DINOv3 ones, as upstream);
    ``orig_target_sizes`` (N, 2) int64, ``[width, height]`` of each
    original image. Outputs: ``labels`` (N, K) int64, ``boxes`` (N, K, 4)
    float32 (x1, y1, x2, y2) in original pixels, ``scores`` (N, K)
    float32, with K ``num_top_queries``.

    The model is for inference only: it is put in eval mode and refuses
    ``train()``.

    Args:
        detector (nn.Module): A detector of the real-time DETR families
            (:func:`check_deployable_type`, :func:`check_deployable_head`),
            with its weights loaded.
        num_top_queries (int): K, upstream's ``num_top_queries``; the
            config's ``model.test_cfg.max_per_img``.
        bgr_input (bool): The detector was trained on BGR images (its
            data preprocessor converts no channels), so the RGB
            ``images`` are flipped first. Defaults to False.
    """

    def __init__(self,
                 detector: nn.Module,
                 num_top_queries: int,
                 bgr_input: bool = False) -> None:
        super().__init__()
        check_deployable_type(type(detector))
        check_deployable_head(detector.bbox_head)
        self.detector = detector
        self.num_top_queries = num_top_queries
        self.bgr_input = bgr_input
        self.eval()

    def train(self, mode: bool = True) -> 'DeployModel':
        """``nn.Module.train``, refused for ``mode=True``: in training mode
        the detector runs every decoder layer and needs data samples."""
        if mode:
            raise ValueError(
                'DeployModel is inference-only: train the detector itself '
                '(DeployModel.detector) and build a new DeployModel.')
        return super().train(False)

    def forward(self, images: Tensor,
                orig_target_sizes: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Detections of a batch; see the class doc."""
        if self.bgr_input:
            images = images.flip(1)
        layers_logits, layers_boxes = self.detector(images, mode='tensor')
        return self.postprocess(layers_logits[-1], layers_boxes[-1],
                                orig_target_sizes)

    def postprocess(
            self, logits: Tensor, boxes: Tensor,
            orig_target_sizes: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Upstream's deploy-mode post-processing
        (:func:`rtdetr_postprocess`) with ``num_top_queries``."""
        return rtdetr_postprocess(logits, boxes, orig_target_sizes,
                                  self.num_top_queries)
