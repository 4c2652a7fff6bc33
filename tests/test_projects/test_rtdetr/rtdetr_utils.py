"""Tiny RT-DETR models shared by the RT-DETR tests."""
import importlib
import os.path as osp

from torch.nn.modules.batchnorm import _BatchNorm
from torch.overrides import TorchFunctionMode

from ...test_models.dino_utils import NO_NOISE, build_model

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
TINY_MODEL_CFG = osp.join(REPO_ROOT, 'configs', '_base_', 'models',
                          'rtdetr_tiny.py')
TINY_CONFIG = osp.join(REPO_ROOT, 'configs', 'rtdetr_tiny.py')
R18VD_CONFIG = osp.join(REPO_ROOT, 'projects', 'RT-DETR', 'configs',
                        'rtdetr_r18vd_6x_coco.py')


def import_project():
    """Register the RT-DETR components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.RT-DETR.rtdetr')


def tiny_rtdetr_cfg(deterministic: bool = False):
    """configs/_base_/models/rtdetr_tiny.py's model; ``deterministic``
    switches the dn noise off (see dino_utils.NO_NOISE)."""
    from mmengine.config import Config
    cfg = Config.fromfile(TINY_MODEL_CFG).model
    if deterministic:
        cfg.dn_cfg.label_noise_scale = NO_NOISE
        cfg.dn_cfg.box_noise_scale = NO_NOISE
    return cfg


def build_tiny(deterministic: bool = False, seed: int = 0):
    """The tiny RT-DETR in train mode; ``deterministic`` also puts every
    BN layer (backbone, neck, input projection) on its running
    statistics, so no image's loss depends on the rest of its batch."""
    import_project()
    model = build_model(tiny_rtdetr_cfg(deterministic), seed=seed)
    if deterministic:
        for module in model.modules():
            if isinstance(module, _BatchNorm):
                module.eval()
    return model


def drop_dn_padding_of_gt_less_images(head) -> None:
    """RTDETRHead's form of ``dino_utils.drop_dn_padding_of_gt_less_images``
    (which patches the per-image ``_get_dn_targets_single``, a method the
    batched RT-DETR loss does not call): zero the dn classification weight
    of the images without GT through ``_dn_label_weights``."""
    weights_of = head._dn_label_weights

    def weights(counts, dn_meta):
        return [
            weight if count else 0.0
            for count, weight in zip(counts, weights_of(counts, dn_meta))
        ]

    head._dn_label_weights = weights


# Ops whose output shape or value the host reads (a device sync on CUDA).
HOST_READ_OPS = ('aten::_local_scalar_dense', 'aten::nonzero',
                 'aten::_unique2', 'aten::unique_dim',
                 'aten::unique_consecutive')


class HostReads(TorchFunctionMode):
    """Counts the reads of tensor data by the host: each one waits for
    the device on CUDA. Python-level ones are seen here (``.cpu()``,
    ``.item()``, ``bool(tensor)``, ...), the ones inside ops (``nonzero``,
    boolean indexing, ``unique``) by the profiler in :func:`host_reads`."""

    NAMES = ('cpu', 'tolist', 'item', '__bool__', '__int__', '__float__')

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += getattr(func, '__name__', '') in self.NAMES
        return func(*args, **(kwargs or {}))


def host_reads(fn) -> int:
    """Host reads of device data while ``fn()`` runs."""
    from torch.profiler import profile
    with profile() as prof, HostReads() as python_level:
        fn()
    return python_level.count + sum(event.count
                                    for event in prof.key_averages()
                                    if event.key in HOST_READ_OPS)
