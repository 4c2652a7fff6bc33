"""Build the deploy model of a config and a checkpoint: weights, K, input
size and normalisation all read from them, each logged."""
import copy
import json
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, Iterator, Optional, Sequence, Tuple, Union

import torch
from mmengine.config import Config
from mmengine.logging import print_log
from torch import nn

from .deploy_model import DeployModel, check_deployable_type

# What MMEngine's EMAHook writes: ``before_save_checkpoint`` swaps the
# averaged weights into ``state_dict`` and the trained ones into
# ``ema_state_dict`` (as ``module.<name>``, with ``steps``), "so that we can
# directly load the averaged model weights for deployment".
EMA_KEY = 'ema_state_dict'


@dataclass
class DeployInfo:
    """What the deploy model was built from, for logs, ONNX metadata and
    the callers that prepare its inputs.

    Attributes:
        config (str | None): The config file, if one was given.
        checkpoint (str | None): The checkpoint file (None: constructor
            initialisation, for tests).
        weights (str): ``'ema'`` (the averaged weights of an EMAHook
            checkpoint), ``'trained'`` (its other weights, ``ema=False``),
            ``'model'`` (a checkpoint without EMA, or a converted upstream
            one) or ``'random'`` (no checkpoint).
        detector (str): The detector's type name.
        num_classes (int): Classes the head scores.
        num_top_queries (int): K, detections per image
            (``model.test_cfg.max_per_img``).
        input_size (tuple[int, int]): (H, W) of ``images``.
        mean (tuple[float, ...]): Per-channel mean (RGB) subtracted from
            the [0, 1] image: the data preprocessor's ``mean / 255``.
        std (tuple[float, ...]): Per-channel divisor, ``std / 255``.
        classes (tuple[str, ...] | None): Class names of the config's test
            dataset, when it names them and they match ``num_classes``.
    """
    config: Optional[str]
    checkpoint: Optional[str]
    weights: str
    detector: str
    num_classes: int
    num_top_queries: int
    input_size: Tuple[int, int]
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    classes: Optional[Tuple[str, ...]] = None

    def metadata(self) -> Dict[str, str]:
        """The attributes as strings, for ONNX ``metadata_props``:
        sequences as JSON lists (floats to float32 precision)."""

        def text(value) -> str:
            if not isinstance(value, (tuple, list)):
                return str(value)
            return json.dumps([
                float(f'{v:.9g}') if isinstance(v, float) else v for v in value
            ])

        return {
            key: text(value)
            for key, value in asdict(self).items() if value is not None
        }


def build_deploy_model(cfg: Union[str, Config],
                       checkpoint: Optional[str] = None,
                       size: Optional[Sequence[int]] = None,
                       device: Union[str, torch.device] = 'cpu',
                       trusted_checkpoints: Optional[Iterable[str]] = None,
                       ema: bool = True) -> Tuple[DeployModel, DeployInfo]:
    """The :class:`DeployModel` of a real-time DETR config, and what it
    was built from.

    - the detector type is checked before anything is built (a clear
      ``ValueError`` for other detectors);
    - weights: the checkpoint's ``state_dict``, loaded strictly. In a
      checkpoint with ``ema_state_dict`` (MMEngine's ``EMAHook`` and the
      projects' ``ModelEMAHook``) that ``state_dict`` holds the EMA
      weights (the hook swaps them in when it saves; ``ema_state_dict``
      then holds the trained ones), which upstream's export uses too
      (``ema.module``); ``ema=False`` takes the trained ones. The log
      says which;
    - K: ``model.test_cfg.max_per_img`` (the head's ``predict`` default,
      ``num_queries``, without it);
    - input size: ``size``, else the ``Resize`` scale of the config's
      test pipeline; it must be a multiple of the data preprocessor's
      ``pad_size_divisor`` (mmdet would pad other sizes);
    - normalisation: the data preprocessor's ``mean`` / ``std`` over 255
      (see :class:`DeployModel`).

    Ends with one forward pass of a dummy batch, which fills the ports'
    per-size caches and checks the output shapes.

    Args:
        cfg (str | Config): Config file or loaded config (its
            ``custom_imports`` are imported).
        checkpoint (str, optional): Checkpoint file, loaded with
            ``weights_only=True``
            (:func:`mmddp_ext.utils.load_checkpoint_file`). Defaults to
            None: constructor initialisation.
        size (Sequence[int], optional): (H, W) of the input. Defaults to
            None: the test pipeline's.
        device (str | torch.device): Where the model runs. Defaults to
            'cpu'.
        trusted_checkpoints (Iterable[str], optional): Paths allowed to
            load with ``weights_only=False``. Defaults to None.
        ema (bool): Take the EMA weights where the checkpoint has them;
            False takes the trained ones (``ema_state_dict``). Defaults
            to True.

    Returns:
        tuple[DeployModel, DeployInfo]: The model, in eval mode on
        ``device``, and its description.

    Raises:
        ValueError: An unsupported detector or head, a checkpoint that
            does not match the model, no size, or a size the model does
            not take.
    """
    config_file = cfg if isinstance(cfg, str) else getattr(
        cfg, 'filename', None)
    cfg, detector = _build_detector(cfg)
    weights = _load_weights(detector, checkpoint, trusted_checkpoints, ema)
    height, width = _input_size(cfg, size, detector.data_preprocessor)
    mean, std, bgr_input = _normalisation(detector.data_preprocessor)
    num_top_queries = _num_top_queries(detector)
    model = DeployModel(
        detector, num_top_queries, bgr_input=bgr_input).to(device)
    info = DeployInfo(
        config=config_file,
        checkpoint=checkpoint,
        weights=weights,
        detector=type(detector).__name__,
        num_classes=detector.bbox_head.num_classes,
        num_top_queries=num_top_queries,
        input_size=(height, width),
        mean=mean,
        std=std,
        classes=_classes(cfg, detector.bbox_head.num_classes))
    _check_outputs(model, info, device)
    print_log(
        f'deploy model: {info.detector}, {info.num_classes} classes, '
        f'images (N, 3, {height}, {width}) RGB in [0, 1], minus mean '
        f'{_rounded(mean)}, divided by std {_rounded(std)}; '
        f'orig_target_sizes (N, 2) [w, h]; K = {num_top_queries}',
        logger='current')
    return model, info


def _build_detector(cfg: Union[str, Config]) -> Tuple[Config, nn.Module]:
    """The config (loaded, its ``custom_imports`` imported) and its
    detector, whose type is checked before it is built."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope
    from mmengine.utils import import_modules_from_strings
    if isinstance(cfg, str):
        cfg = Config.fromfile(cfg)
    elif cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    model_type = cfg.model.get('type')
    detector_type = model_type if isinstance(model_type,
                                             type) else MODELS.get(model_type)
    if detector_type is None:
        raise ValueError(
            f'model.type={model_type!r} is not registered in mmdet: add the '
            "package that defines it to the config's custom_imports.")
    check_deployable_type(detector_type)
    # mmdet's DETR constructors write into the dict they are given
    return cfg, MODELS.build(copy.deepcopy(cfg.model))


def _load_weights(detector: nn.Module, checkpoint: Optional[str],
                  trusted: Optional[Iterable[str]], ema: bool) -> str:
    """Load ``checkpoint``'s weights strictly (see
    :func:`build_deploy_model`); return which ones, after logging it."""
    if checkpoint is None:
        print_log(
            'deploy model: no checkpoint, weights as the constructors '
            'initialise them',
            logger='current',
            level=30)
        return 'random'
    from ..utils import load_checkpoint_file
    loaded = load_checkpoint_file(
        checkpoint, map_location='cpu', trusted=trusted)
    state, weights, why = _choose_weights(loaded, checkpoint, ema)
    fix = ('Export with the config the checkpoint was trained with; '
           'convert upstream checkpoints with tools/convert_*_checkpoint.py '
           '--config CONFIG.')
    try:
        result = detector.load_state_dict(state, strict=False)
    except RuntimeError as error:  # tensors of other shapes
        raise ValueError(f'{checkpoint} does not match the config\'s model: '
                         f'{error} {fix}') from error
    if result.missing_keys or result.unexpected_keys:
        raise ValueError(
            f'{checkpoint} does not match the config\'s model: '
            f'{len(result.missing_keys)} weights missing (e.g. '
            f'{result.missing_keys[:3]}), {len(result.unexpected_keys)} '
            f'unexpected (e.g. {result.unexpected_keys[:3]}). {fix}')
    print_log(f'deploy model: {why}', logger='current')
    return weights


def _choose_weights(loaded: dict, checkpoint: str,
                    ema: bool) -> Tuple[Dict[str, torch.Tensor], str, str]:
    """The state dict to load, ``'ema'`` / ``'trained'`` / ``'model'``,
    and a sentence saying which weights these are (MMEngine's layout read
    by :func:`~mmddp_ext.utils.split_mmengine_checkpoint`)."""
    from ..utils import CheckpointConversionError, split_mmengine_checkpoint
    try:
        trained, averaged, steps = split_mmengine_checkpoint(loaded)
    except CheckpointConversionError as error:
        raise ValueError(
            f'{checkpoint}: {error} Export an MMEngine checkpoint of this '
            'config, or convert an upstream one first '
            '(tools/convert_rtdetr_checkpoint.py, convert_dfine_checkpoint'
            '.py, convert_deimv2_checkpoint.py).') from error
    if averaged is None:
        source = (loaded.get('meta') or {}).get('source')
        return trained, 'model', (
            f'weights of {checkpoint}, without EMA (no {EMA_KEY})' +
            (f"; converted from upstream's {source!r}" if source else ''))
    if ema:
        return averaged, 'ema', (
            f'EMA weights of {checkpoint} ({steps} EMA updates): its '
            'state_dict, where the EMA hook puts the averaged weights when '
            'it saves (ema_state_dict then holds the trained ones)')
    return trained, 'trained', (
        f'trained weights of {checkpoint} (ema=False): its '
        f'{EMA_KEY}, where the EMA hook puts them when it saves; the EMA '
        f'of {steps} updates in state_dict is not used')


def _input_size(cfg: Config, size: Optional[Sequence[int]],
                preprocessor: nn.Module) -> Tuple[int, int]:
    """(H, W): ``size``, else the test pipeline's ``Resize`` scale, as a
    multiple of the preprocessor's ``pad_size_divisor``."""
    if size is not None:
        if len(size) != 2 or min(size) <= 0:
            raise ValueError(f'size must be (H, W) > 0, got {size}.')
        height, width = (int(s) for s in size)
        print_log(
            f'deploy model: input size {height}x{width} (given)',
            logger='current')
    else:
        (height, width), keep_ratio = _test_resize(cfg)
        print_log(
            f'deploy model: input size {height}x{width}, the test '
            "pipeline's Resize scale",
            logger='current')
        if keep_ratio:
            print_log(
                "deploy model: the test pipeline's Resize keeps the aspect "
                f'ratio within {width}x{height}; the exported model, as '
                f"upstream's, takes images resized to exactly {height}x"
                f'{width}',
                logger='current',
                level=30)
    divisor = getattr(preprocessor, 'pad_size_divisor', 1) or 1
    if height % divisor or width % divisor:
        raise ValueError(
            f'input size {height}x{width} is not a multiple of '
            f'model.data_preprocessor.pad_size_divisor={divisor}: mmdet '
            'pads such images, so the model never sees this size. Give a '
            f'size that is a multiple of {divisor} (--size H W).')
    return height, width


def _test_resize(cfg: Config) -> Tuple[Tuple[int, int], bool]:
    """(H, W) and ``keep_ratio`` of the first ``Resize`` with a ``scale``
    in the test dataset's pipelines (wrappers included) or
    ``test_pipeline``."""
    for step in _test_pipeline_steps(cfg):
        if (str(step.get('type', '')).split('.')[-1] == 'Resize'
                and step.get('scale') is not None):
            scale = step['scale']
            width, height = (scale, scale) if isinstance(scale, int) else scale
            return (int(height), int(width)), bool(step.get('keep_ratio'))
    raise ValueError(
        'The config has no Resize with a scale in test_dataloader.dataset'
        "'s pipeline or test_pipeline, so the input size is unknown. Give "
        'it: --size H W (tools/export_onnx.py) or size=(H, W).')


def _test_pipeline_steps(cfg: Config) -> Iterator[dict]:
    dataset = (cfg.get('test_dataloader') or {}).get('dataset')
    while isinstance(dataset, dict):
        yield from dataset.get('pipeline') or []
        dataset = dataset.get('dataset')
    yield from cfg.get('test_pipeline') or []


def _normalisation(
    preprocessor: nn.Module
) -> Tuple[Tuple[float, ...], Tuple[float, ...], bool]:
    """``mean / 255``, ``std / 255`` and whether the model takes BGR."""
    if not hasattr(preprocessor, '_channel_conversion'):
        raise ValueError(
            f'model.data_preprocessor type {type(preprocessor).__name__!r} '
            'is not an ImgDataPreprocessor (DetDataPreprocessor): the '
            'normalisation the exported model expects is unknown. Use '
            "type='DetDataPreprocessor' with mean, std and bgr_to_rgb.")
    if getattr(preprocessor, '_enable_normalize', False):
        # one value, or one per channel
        mean = tuple(float(m) / 255 for m in preprocessor.mean.flatten())
        std = tuple(float(s) / 255 for s in preprocessor.std.flatten())
    else:
        # the model takes [0, 255] images: (x - 0) / (1 / 255)
        mean, std = (0.0, ) * 3, (1 / 255, ) * 3
    bgr_input = not preprocessor._channel_conversion
    if bgr_input:
        # the preprocessor's values are per BGR channel; images are RGB
        mean, std = mean[::-1], std[::-1]
        print_log(
            'deploy model: the data preprocessor converts no channels, so '
            'the model was trained on BGR images as loaded; the exported '
            "model takes RGB, as upstream's, and flips them",
            logger='current',
            level=30)
    return mean, std, bgr_input


def _num_top_queries(detector: nn.Module) -> int:
    """K from ``model.test_cfg.max_per_img`` (logged)."""
    test_cfg = detector.bbox_head.test_cfg or {}
    limit = detector.num_queries * detector.bbox_head.num_classes
    if 'max_per_img' in test_cfg:
        k = int(test_cfg['max_per_img'])
        where = 'model.test_cfg.max_per_img'
    else:
        k = detector.num_queries
        where = ('model.num_queries (model.test_cfg has no max_per_img; '
                 "the head's predict keeps as many)")
    if not 0 < k <= limit:
        raise ValueError(
            f'{where}={k} must be in 1..num_queries * num_classes = '
            f'{limit}. Set model.test_cfg.max_per_img (upstream '
            'num_top_queries, 300).')
    print_log(
        f'deploy model: K = {k} detections per image, from {where}',
        logger='current')
    return k


def _classes(cfg: Config, num_classes: int) -> Optional[Tuple[str, ...]]:
    """The test dataset's class names, if the config gives them (or its
    dataset type does) and there are ``num_classes`` of them."""
    from mmdet.registry import DATASETS
    dataset = (cfg.get('test_dataloader') or {}).get('dataset')
    while isinstance(dataset, dict):
        names = (dataset.get('metainfo') or {}).get('classes')
        dataset_type = DATASETS.get(dataset.get('type', ''))
        if names is None and hasattr(dataset_type, 'METAINFO'):
            names = dataset_type.METAINFO.get('classes')
        if names is not None:
            return tuple(names) if len(names) == num_classes else None
        dataset = dataset.get('dataset')
    return None


def _check_outputs(model: DeployModel, info: DeployInfo,
                   device: Union[str, torch.device]) -> None:
    """Run a dummy batch of two; refuse outputs off the contract."""
    height, width = info.input_size
    images = torch.zeros(2, 3, height, width, device=device)
    sizes = torch.tensor([[width, height]] * 2, device=device)
    with torch.no_grad():
        labels, boxes, scores = model(images, sizes)
    k = info.num_top_queries
    shapes = tuple(tuple(t.shape) for t in (labels, boxes, scores))
    if shapes != ((2, k), (2, k, 4), (2, k)):
        raise ValueError(
            f'{info.detector} returned labels, boxes, scores of shapes '
            f'{shapes} for 2 images, not (2, {k}), (2, {k}, 4), (2, {k}): '
            'its head does not hand (logits, boxes) of every decoder layer '
            'run to the post-processing, as the supported families do.')


def _rounded(values: Sequence[float]) -> str:
    return '(' + ', '.join(f'{v:.4g}' for v in values) + ')'
