"""The doctor's paste line for a GT-less rank's missing denoising part
names the DDP-safe classes the config's own classes derive from
(``mmddp_ext.doctor.ddp_safe_types``), read from their MRO: a D-FINE or
DEIMv2 model with upstream's empty-batch behaviour gets its port's class
back, mmdet's DINO gets ``DDPSafeDINO``. In process, no ranks (the doctor
runs that print the line are test_ddp_doctor_dfine_deim.py's).

Negative control: the line the doctor printed before for every DINO-family
detector (``DDPSafeDINO`` / ``DDPSafeDINOHead``), pasted into the D-FINE
config, does not build: DINO's constructor refuses D-FINE's keys.
"""
from importlib import import_module

import pytest
import torch.nn as nn
from mmdet.models import DINO
from mmdet.models.dense_heads import DINOHead
from mmengine.config import Config

from mmddp_ext.doctor.ddp_safe_types import ddp_safe_types, nearest_shipped
from mmddp_ext.models.dense_heads.ddp_safe_dino_head import DDPSafeDINOHead
from mmddp_ext.models.detectors.ddp_safe_dino import DDPSafeDINO
from ..test_projects.test_deimv2 import deimv2_probe
from ..test_projects.test_dfine import ddp_probe
from ..test_projects.test_dfine.dfine_utils import build_tiny, tiny_model_cfg


class UsersDINO(DDPSafeDINO):
    """A user's subclass, defined outside the package."""


def test_nearest_shipped_class_in_the_mro():
    assert nearest_shipped(ddp_probe.DFINEUpstreamEmptyDn,
                           DDPSafeDINO) == 'DFINE'
    assert nearest_shipped(deimv2_probe.DEIMv2UpstreamEmptyDn,
                           DDPSafeDINO) == 'DEIMv2'
    assert nearest_shipped(deimv2_probe.DEIMv2UpstreamEmptyDnHead,
                           DDPSafeDINOHead) == 'DEIMv2Head'
    assert nearest_shipped(UsersDINO, DDPSafeDINO) == 'DDPSafeDINO'
    # mmdet's own classes are not DDP-safe and not ours
    assert nearest_shipped(DINO, DDPSafeDINO) is None
    assert nearest_shipped(DINOHead, DDPSafeDINOHead) is None


PORT_PACKAGES = ('projects.RT-DETR.rtdetr', 'projects.D-FINE.dfine',
                 'projects.DEIM.deim', 'projects.DEIMv2.deimv2',
                 'projects.CO-DETR.codetr')


def test_every_registered_port_names_itself():
    """Each DDP-safe detector and head that the model ports register (as
    a config's custom_imports would) is found through the registry and
    names itself; the ports are not looked up on disk."""
    from mmdet.registry import MODELS
    for package in PORT_PACKAGES:
        import_module(package)
    named = {}
    for cls in MODELS.module_dict.values():
        if not (isinstance(cls, type)
                and cls.__module__.startswith(PORT_PACKAGES)):
            continue
        for base in (DDPSafeDINO, DDPSafeDINOHead):
            if issubclass(cls, base):
                named[cls.__name__] = nearest_shipped(cls, base)
    assert named == {
        name: name
        for name in ('RTDETR', 'RTDETRHead', 'DFINE', 'DFINEHead',
                     'DEIMRTDETR', 'DEIMHead', 'DEIMv2', 'DEIMv2Head',
                     'CoDINOHead')
    }


def test_the_marker_and_the_registry_decide():
    """A class from outside mmddp_ext and projects/ is named once it is
    registered and declares ``ddp_safe_empty_gt``; a registered subclass
    that does not declare it again falls back to it, and an unregistered
    one is never named."""
    from mmdet.registry import MODELS

    class UsersSafeDINO(DDPSafeDINO):
        ddp_safe_empty_gt = True

    class UsersChangedDINO(UsersSafeDINO):
        pass

    assert nearest_shipped(UsersSafeDINO, DDPSafeDINO) == 'DDPSafeDINO'
    try:
        for cls in (UsersSafeDINO, UsersChangedDINO):
            MODELS.register_module(module=cls)
        assert nearest_shipped(UsersSafeDINO, DDPSafeDINO) == 'UsersSafeDINO'
        assert (nearest_shipped(UsersChangedDINO,
                                DDPSafeDINO) == 'UsersSafeDINO')
    finally:
        for cls in (UsersSafeDINO, UsersChangedDINO):
            MODELS.module_dict.pop(cls.__name__, None)


def test_the_paste_line_keeps_the_ports_detector():
    upstream = build_tiny(type='DFINEUpstreamEmptyDn')
    assert ddp_safe_types(upstream) == ('DFINE', 'DFINEHead')
    # the port itself: nothing to change; not a DINO: no line
    assert ddp_safe_types(build_tiny()) is None
    assert ddp_safe_types(nn.Linear(1, 1)) is None


@pytest.mark.parametrize('paste, builds', [
    (dict(type='DFINE', bbox_head=dict(type='DFINEHead')), True),
    (dict(type='DDPSafeDINO', bbox_head=dict(type='DDPSafeDINOHead')),
     False),
])
def test_pasted_into_the_config(paste, builds):
    """The line merged into D-FINE's tiny config (with upstream's
    empty-batch behaviour) as a user pastes it: the doctor's builds the
    port; the old one fails to build."""
    from mmdet.registry import MODELS
    cfg = Config(dict(model=tiny_model_cfg(type='DFINEUpstreamEmptyDn')))
    cfg.merge_from_dict(dict(model=paste))
    if builds:
        model = MODELS.build(cfg.model)
        assert type(model).__name__ == 'DFINE'
        assert type(model.bbox_head).__name__ == 'DFINEHead'
    else:
        with pytest.raises(TypeError, match='unexpected keyword argument'):
            MODELS.build(cfg.model)
