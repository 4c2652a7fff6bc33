"""Paths and imports shared by the DEIM tests."""
import importlib
import os.path as osp

REPO_ROOT = osp.dirname(
    osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__)))))
PROJECT = osp.join(REPO_ROOT, 'projects', 'DEIM')
DFINE_PROJECT = osp.join(REPO_ROOT, 'projects', 'D-FINE')


def import_deim():
    """Register the DEIM components (and D-FINE's, RT-DETR's);
    hyphen-free, but imported by name like its siblings."""
    return importlib.import_module('projects.DEIM.deim')


def import_dfine():
    """Register the D-FINE components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.D-FINE.dfine')


def import_rtdetr():
    """Register the RT-DETR components (hyphenated dir: importlib)."""
    return importlib.import_module('projects.RT-DETR.rtdetr')
